"""Enrollment by pairing code: a node trades its owner's one-time code for its credential.

    python -m worker enroll CODE [--node-id ID] [--worker-id ID] [--conversations-address HOST:PORT]
                                 [--credential-file PATH]

The owner creates the code in the console or with `python -m services.bff_gateway pairing-code`.
`enroll` sends it with this node's id and worker id to the conversations service's `EnrollDevice`
and stores the answer, a worker token bound to this node, this worker and the code's owner that
names the new device, in the credential file: `$BOSS_WORKER_CREDENTIAL`, else
`$BOSS_DATA_DIR/worker-credential.json`. The file is created readable and writable by its owner only
(mode 0600, in a folder of mode 0700 when it creates one), written whole or not at all (a temporary
file renamed over the old one). `python -m worker run` then uses it: its node and worker ids become
the defaults, and its token the token (an explicit --token or BOSS_WORKER_TOKEN still wins). A
credential file that others may read is refused: fix its mode or enroll again.

If the owner revokes the device, every service refuses the token: enroll again with a new code
(the old file is replaced).
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
from boss.conversations.v1 import conversations_pb2 as pb
from boss.conversations.v1 import conversations_pb2_grpc as pb_grpc

from boss_common import config
from boss_common.channels import ChannelSettingsError, open_channel
from boss_common.time import from_timestamp, isoformat_utc

CREDENTIAL_FILE_NAME = "worker-credential.json"
RPC_TIMEOUT_SECONDS = 15.0
OWNER_ONLY_FILE = 0o600
OWNER_ONLY_FOLDER = 0o700


class EnrollmentError(Exception):
    """Enrollment or the stored credential went wrong; the message says what to do."""


@dataclass(frozen=True)
class Credential:
    """What enrollment stores: the worker token and who it is for.

    Attributes:
        worker_token: the bearer token (bound to node_id, worker_id and owner_id; names device_id).
        device_id, owner_id, node_id, worker_id: the enrolled device.
        token_expires_at: when the token expires (RFC 3339 UTC).
    """

    worker_token: str
    device_id: str
    owner_id: str
    node_id: str
    worker_id: str
    token_expires_at: str

    def __repr__(self) -> str:
        return (
            f"Credential(device_id={self.device_id!r}, owner_id={self.owner_id!r}, node_id={self.node_id!r})"
        )


def credential_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the credential is kept: $BOSS_WORKER_CREDENTIAL, else $BOSS_DATA_DIR/worker-credential.json."""
    environ = os.environ if environ is None else environ
    configured = environ.get("BOSS_WORKER_CREDENTIAL")
    if configured:
        return Path(configured).expanduser()
    data = Path(environ.get("BOSS_DATA_DIR") or "var").expanduser().resolve()
    return data / CREDENTIAL_FILE_NAME


def write_credential(path: Path, credential: Credential) -> None:
    """Stores `credential` at `path` readable by its owner only (0600), atomically; creates a
    missing folder with mode 0700. Raises OSError."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=OWNER_ONLY_FOLDER)
    handle, temporary = tempfile.mkstemp(prefix=".credential-", dir=path.parent)
    try:
        os.fchmod(handle, OWNER_ONLY_FILE)
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            json.dump(asdict(credential), stream, indent=1)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read_credential(path: Path) -> Credential | None:
    """The stored credential, or None when there is none. Raises EnrollmentError when the file is
    readable or writable by others than its owner, or is not a credential."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise EnrollmentError(
            f"{path} may be read by others (mode {stat.S_IMODE(mode):o}): run `chmod 600 {path}` "
            "or enroll again"
        )
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
        return Credential(**{name: str(values[name]) for name in Credential.__dataclass_fields__})
    except (ValueError, KeyError, TypeError) as error:
        raise EnrollmentError(f"{path} is not a worker credential ({error}): enroll again") from error


async def enroll(
    pairing_code: str,
    *,
    node_id: str,
    worker_id: str,
    device_name: str,
    conversations_address: str,
    channel: grpc.aio.Channel | None = None,
) -> Credential:
    """Trades `pairing_code` for this node's credential (EnrollDevice). Raises EnrollmentError with
    the service's reason (a wrong, used or expired code; a node already enrolled; unreachable), or
    before any call when the transport settings would carry the code and the credential in plaintext
    to another machine (boss_common/channels.py, `check_worker_transport`)."""
    own_channel = channel is None
    try:
        active = channel or open_channel(conversations_address, for_worker=True)
    except ChannelSettingsError as error:
        raise EnrollmentError(str(error)) from None
    try:
        response = await pb_grpc.ConversationsServiceStub(active).EnrollDevice(
            pb.EnrollDeviceRequest(
                pairing_code=pairing_code, node_id=node_id, worker_id=worker_id, device_name=device_name
            ),
            timeout=RPC_TIMEOUT_SECONDS,
        )
    except grpc.aio.AioRpcError as error:
        raise EnrollmentError(f"enrollment refused ({error.code().name}): {error.details()}") from error
    finally:
        if own_channel:
            await active.close()
    device = response.device
    return Credential(
        worker_token=response.worker_token,
        device_id=device.device_id,
        owner_id=device.owner_id,
        node_id=device.node_id,
        worker_id=device.worker_id,
        token_expires_at=isoformat_utc(from_timestamp(response.token_expires_at)) or "",
    )


def default_conversations_address() -> str:
    """BOSS_CONVERSATIONS_ADDRESS, else the local default."""
    return config.service_address("conversations")
