"""video-sidecar client: push frames from a generation worker to the sidecar daemon.

```python
from client import SidecarClient

with SidecarClient() as sidecar:
    result = sidecar.encode(video, fps=24, path="job-42.mp4")
    print(result.path, result.timings.total_ms)
```

`AsyncSidecarClient` has the same methods, awaited. `export_to_video(frames, path, fps)`
is a drop-in for `diffusers.utils.export_to_video` (`_export`): it starts a daemon in the
background where none answers, and writes the file wherever its caller may. Errors carry `code` (a
`grpc.StatusCode`) and `reason` (a `Reason`, the daemon's documented reason code, e.g.
`Reason.DISK_FULL`); `_errors` shows the tree.

Design: the client is written once, as an I/O-free core under two thin drivers. Every
operation (attach and re-attach after a daemon restart, leases and the spare lease,
planning, the encode, a stream's writes, close and cancel, fork awareness, error mapping)
is a generator of steps in the core (`_core`, `_plan`, `_send`, `_stream`); it yields what
it needs done (an RPC, a copy, a lock, an action on a stream call) and gets the result back
(`_steps`). `SidecarClient` (`_sync`) performs each step blocking, `AsyncSidecarClient`
(`_async`) awaits it; each holds only its channel and how it performs a step. The public
methods with many parameters are defined once for both (`_api`), their parameter set once
(`_options.EncodeOptions`). An encode goes one of three ways (the framed socket, Encode,
EncodeStream), each a class behind one interface (`_ways`),
picked by one function from the request's facts (`_choice.choose_way`). `_api`'s
docstring says why this and not a generated sync twin.

This package never imports av. It imports torch only when handed a tensor.
"""

from sidecar.vocabulary import Reason

from ._async import AsyncSidecarClient
from ._errors import (
    AlreadyExists,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    InvalidVideo,
    NotFound,
    OutOfRange,
    RequestError,
    ResourceExhausted,
    ServerError,
    SidecarClosed,
    SidecarError,
    SidecarUnavailable,
    TransportError,
)
from ._export import export_to_video
from ._live import Live
from ._previews import SpriteSheet, Thumbnail
from ._sync import SidecarClient
from ._types import Attachment, EncodeResult, FrameRange, Lease, Preview, Status, Timings

__all__ = [
    "AlreadyExists",
    "AsyncSidecarClient",
    "Attachment",
    "Cancelled",
    "DeadlineExceeded",
    "EncodeResult",
    "FailedPrecondition",
    "FrameRange",
    "InvalidArgument",
    "InvalidVideo",
    "Lease",
    "Live",
    "NotFound",
    "OutOfRange",
    "Preview",
    "Reason",
    "RequestError",
    "ResourceExhausted",
    "ServerError",
    "SidecarClient",
    "SidecarClosed",
    "SidecarError",
    "SidecarUnavailable",
    "SpriteSheet",
    "Status",
    "Thumbnail",
    "Timings",
    "TransportError",
    "export_to_video",
]
