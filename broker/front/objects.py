"""Which shared-memory objects a client may register: the object decides, not its name.

A client reaches only memory it could open itself, or that the server created for it (a
``created`` registration, not this).  The broker opens the object without following a
symlink or blocking on a FIFO and checks what it is:

- a regular file (``shm.window.open_object``);
- not one of the server's own objects under another name (a hard link to the arena, to a
  worker's output region or to another client's server-made region): its inode is compared
  with every ``inferpool-`` object in /dev/shm;
- readable and writable by the client, by the mode bits the kernel would apply to the
  client's user and groups (``Peer.access_uid``; ACLs are not consulted, so an object
  shared by an ACL alone is refused).

The worker later maps the inode checked here, and only that (``shm.refs``).
"""

from __future__ import annotations

import os
import stat

from inferpool.broker.front.peers import Peer, require_access
from inferpool.shm.runs import PREFIX, SHM_DIR
from inferpool.shm.window import open_object
from inferpool.wire.errors import invalid_arg, not_found

_RW = 0o6


def check_object(key: str, peer: Peer) -> os.stat_result:
    """The status of object ``key`` if ``peer`` may register it; else the error why not."""
    uid = require_access(peer, "register shared memory")
    try:
        fd, st = open_object(key)
    except FileNotFoundError:
        raise not_found(f"shared-memory object '/{key}' does not exist") from None
    except OSError as exc:
        raise invalid_arg(
            f"shared-memory object '/{key}' cannot be opened read-write by the server: "
            f"{exc.strerror}"
        ) from None
    except ValueError as exc:
        raise invalid_arg(str(exc)) from None
    os.close(fd)
    if (st.st_dev, st.st_ino) in _server_inodes():
        raise invalid_arg(
            f"shared-memory object '/{key}' is one of the server's own regions under "
            "another name; use create_shared_memory_region for a server-made region"
        )
    if not may_read_write(st, uid, peer.gids):
        raise invalid_arg(
            f"shared-memory object '/{key}' (owner uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):04o}) cannot be opened read-write by this client "
            f"(uid {uid}): a client may register only memory it could open itself"
        )
    return st


def may_read_write(st: os.stat_result, uid: int, gids: frozenset[int]) -> bool:
    """Whether user ``uid`` in groups ``gids`` may open the object read-write (mode bits)."""
    if uid == 0:
        return True
    if st.st_uid == uid:
        bits = st.st_mode >> 6
    elif st.st_gid in gids:
        bits = st.st_mode >> 3
    else:
        bits = st.st_mode
    return bits & _RW == _RW


def _server_inodes() -> set[tuple[int, int]]:
    """The inodes of every inferpool object in /dev/shm (this server's and any other's)."""
    inodes = set()
    for entry in os.listdir(SHM_DIR):
        if entry.startswith(PREFIX):
            try:
                st = os.lstat(os.path.join(SHM_DIR, entry))
            except OSError:
                continue
            inodes.add((st.st_dev, st.st_ino))
    return inodes
