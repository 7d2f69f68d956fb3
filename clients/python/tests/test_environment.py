"""The session environment the READMEs describe (src/daemon/environment.rs): without ``env``,
commands get HOME, USER, LOGNAME and SHELL from the user's passwd entry, a system PATH and
LANG=C.UTF-8, and nothing of the client's; ``env`` is merged over them entry by entry."""

from __future__ import annotations

import os
import pwd

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _env(session) -> dict[str, str]:
    out = session.shell(["env", "-0"]).stdout.head.decode()
    return dict(entry.split("=", 1) for entry in out.split("\0") if entry)


def test_the_defaults_come_from_the_users_passwd_entry_not_the_client(client, workspace, monkeypatch):
    monkeypatch.setenv("CORRAL_CLIENT_ONLY", "1")
    me = pwd.getpwuid(os.geteuid())
    with client.open_session(workspace) as s:
        env = _env(s)
    assert {k: env.get(k) for k in ("HOME", "USER", "LOGNAME", "SHELL", "PATH", "LANG")} == {
        "HOME": me.pw_dir,
        "USER": me.pw_name,
        "LOGNAME": me.pw_name,
        "SHELL": me.pw_shell,
        "PATH": DEFAULT_PATH,
        "LANG": "C.UTF-8",
    }
    assert "CORRAL_CLIENT_ONLY" not in env
    assert "TMPDIR" not in env


def test_env_is_merged_over_the_defaults(client, workspace):
    me = pwd.getpwuid(os.geteuid())
    with client.open_session(workspace, env={"PATH": "/usr/bin:/bin", "EXTRA": "1", "HOME": str(workspace)}) as s:
        env = _env(s)
    assert env["PATH"] == "/usr/bin:/bin"
    assert env["EXTRA"] == "1"
    assert env["HOME"] == str(workspace)
    assert (env["USER"], env["LANG"]) == (me.pw_name, "C.UTF-8")
