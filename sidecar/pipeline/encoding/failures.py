"""What a failed encode's client is told: the output's fault, the encoder's, or a bug."""

from __future__ import annotations

import errno
import logging

import av

from ...errors import EncodeFailed, SidecarError
from ..admission.plans import EncodePlan
from ..output.files import output_error

log = logging.getLogger(__name__)

# Errors of the output file, not of the encoder: reported as the output's fault.
OUTPUT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EROFS, errno.EIO)


def classify(exc: BaseException, plan: EncodePlan) -> BaseException:
    """The error `plan`'s encode ends with, for `exc` raised while it ran."""
    if isinstance(exc, (SidecarError, KeyboardInterrupt, SystemExit)):
        return exc
    what = str(plan.target.final) if plan.target else "the output"
    if isinstance(exc, OSError) and exc.errno in OUTPUT_ERRNOS:
        return output_error(exc, what)
    if isinstance(exc, (av.error.FFmpegError, ValueError, OSError)):
        log.exception("encode %s failed", plan.request_id)
        return EncodeFailed(f"encoder failed: {exc}")
    log.exception("encode %s failed unexpectedly", plan.request_id)
    return EncodeFailed(f"unexpected {type(exc).__name__}: {exc}")
