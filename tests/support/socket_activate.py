"""Starts a command the way systemd socket activation does: a listening Unix socket on fd 3,
LISTEN_FDS=1 and LISTEN_PID set to the command's pid (exec keeps the pid)."""
import os
import socket
import sys

path = sys.argv[1]
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.bind(path)
sock.listen(16)
os.dup2(sock.fileno(), 3)
os.set_inheritable(3, True)
os.environ["LISTEN_FDS"] = "1"
os.environ["LISTEN_PID"] = str(os.getpid())
os.execv(sys.argv[2], sys.argv[2:])
