"""Runs a command as UID:GID on a host that forbids it user namespaces, without touching the
real host: as root, it enters a new user namespace (mapping root and UID/GID to themselves),
sets user.max_user_namespaces to 0 there (that sysctl is per user namespace, and a limit of an
enclosing namespace binds everything inside it), switches to UID/GID and execs the command.
Inside, unshare(CLONE_NEWUSER) fails with ENOSPC and /proc/sys/user/max_user_namespaces reads
0, exactly as on a host configured with `sysctl user.max_user_namespaces=0`.

Usage: no_user_namespaces.py UID GID COMMAND [ARG...]
Used by tests/it/unprivileged.rs (spec/sandbox.md §6: a non-root daemon fails closed naming the
setting)."""
import ctypes
import os
import sys

CLONE_NEWUSER = 0x10000000

uid, gid = int(sys.argv[1]), int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)

# Mapping more than one id needs CAP_SETUID in the parent namespace, which this process loses
# by entering the new one: a child that stays outside, as root, writes the maps for it.
ready_r, ready_w = os.pipe()
mapped_r, mapped_w = os.pipe()
me = os.getpid()
helper = os.fork()
if helper == 0:
    os.close(ready_w)
    os.close(mapped_r)
    os.read(ready_r, 1)
    with open(f"/proc/{me}/uid_map", "w") as f:
        f.write(f"0 0 1\n{uid} {uid} 1\n")
    with open(f"/proc/{me}/gid_map", "w") as f:
        f.write(f"0 0 1\n{gid} {gid} 1\n")
    os.write(mapped_w, b"m")
    os._exit(0)
os.close(ready_r)
os.close(mapped_w)
if libc.unshare(CLONE_NEWUSER) != 0:
    sys.exit(f"unshare(CLONE_NEWUSER) failed: errno {ctypes.get_errno()}")
os.write(ready_w, b"r")
if os.read(mapped_r, 1) != b"m":
    sys.exit("the helper could not write the id maps")
os.waitpid(helper, 0)
with open("/proc/sys/user/max_user_namespaces", "w") as f:
    f.write("0\n")
os.setgroups([])
os.setresgid(gid, gid, gid)
os.setresuid(uid, uid, uid)
os.close(ready_w)
os.close(mapped_r)
os.execv(sys.argv[3], sys.argv[3:])
