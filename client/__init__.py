"""video-sidecar client: push frames from a generation worker to the sidecar daemon.

```python
from client import SidecarClient

with SidecarClient() as sidecar:
    result = sidecar.encode(video, fps=24, path="job-42.mp4")
    print(result.path, result.timings.total_ms)
```

This package never imports av. It imports torch only when handed a tensor.
"""

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
    SidecarError,
    SidecarUnavailable,
    TransportError,
)
from ._sync import SidecarClient
from ._types import Attachment, EncodeResult, FrameRange, Lease, Status, Timings

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
    "NotFound",
    "OutOfRange",
    "RequestError",
    "ResourceExhausted",
    "ServerError",
    "SidecarClient",
    "SidecarError",
    "SidecarUnavailable",
    "Status",
    "Timings",
    "TransportError",
]
