"""UTC time helpers and protobuf Timestamp conversions, as the services import them: they live in
boss_common/time.py, shared with the worker."""

from boss_common.time import from_timestamp as from_timestamp
from boss_common.time import isoformat_utc as isoformat_utc
from boss_common.time import to_timestamp as to_timestamp
from boss_common.time import utc_now as utc_now
