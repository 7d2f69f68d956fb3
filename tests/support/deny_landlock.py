"""Runs a command under a seccomp filter that makes landlock_create_ruleset fail with ENOSYS,
as on a kernel without Landlock. Used by the fail-closed tests (spec/sandbox.md §8.2 case 40)."""
import ctypes
import os
import struct
import sys

NR_LANDLOCK_CREATE_RULESET = 444  # x86_64 and aarch64
ENOSYS = 38
BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_RET_K = 0x06
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000

program = [
    (BPF_LD_W_ABS, 0, 0, 0),  # A = seccomp_data.nr
    (BPF_JEQ_K, 0, 1, NR_LANDLOCK_CREATE_RULESET),
    (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | ENOSYS),
    (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
]
raw = b"".join(struct.pack("HBBI", *ins) for ins in program)
buf = ctypes.create_string_buffer(raw)


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


prog = SockFprog(len(program), ctypes.addressof(buf))
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
    sys.exit(f"prctl(PR_SET_SECCOMP) failed: errno {ctypes.get_errno()}")
os.execv(sys.argv[1], sys.argv[1:])
