"""Dropping a worker's privileges to a pool's ``user`` / ``group`` after the fork.

What it cannot do: it does not change the environment (HOME, USER stay the parent's), the
working directory, or fds the worker inherited (the parent must close those it does not mean
to share). It needs root (CAP_SETUID/CAP_SETGID) to change anything. Changing the uid or gid
clears PR_SET_PDEATHSIG and makes the process non-dumpable, so the runtime sets the death
signal after this and opens /proc/self/clear_refs before it.
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Identity:
    """Resolved ids to switch to; ``uid`` None keeps the user, ``groups`` the supplementary."""

    uid: int | None
    gid: int
    groups: tuple[int, ...]


def resolve(user: str | int | None, group: str | int | None) -> Identity | None:
    """Names or ids → an ``Identity``; None when neither is given.

    The group defaults to the user's primary group and the supplementary groups to the user's
    (as ``initgroups``). Raises KeyError naming an unknown user or group.
    """
    pw = _user(user) if user is not None else None
    if pw is None:
        if group is None:
            return None
        gid = _group(group)
        return Identity(None, gid, (gid,))
    gid = _group(group) if group is not None else pw.pw_gid
    return Identity(pw.pw_uid, gid, tuple(os.getgrouplist(pw.pw_name, gid)))


def _user(user: str | int) -> pwd.struct_passwd:
    """The password entry of a user name or uid."""
    try:
        return pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(user)
    except KeyError:
        raise KeyError(f"unknown user {user!r}") from None


def _group(group: str | int) -> int:
    """The gid of a group name or gid."""
    try:
        return (grp.getgrgid(group) if isinstance(group, int) else grp.getgrnam(group)).gr_gid
    except KeyError:
        raise KeyError(f"unknown group {group!r}") from None


def drop(identity: Identity) -> None:
    """Switch to ``identity`` for good: groups, then gid, then uid (the only safe order).

    Raises OSError when not permitted, and PermissionError if root could be regained after a
    switch to a non-root uid (the drop would not be permanent).
    """
    os.setgroups(list(identity.groups))
    os.setgid(identity.gid)
    if identity.uid is None:
        return
    os.setuid(identity.uid)
    if identity.uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            return
        raise PermissionError("setuid(0) succeeded after dropping privileges")
