"""A job's route to encode by is chosen once, in one place (see routes)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from sidecar.pipeline.encoding.process_route import InEncoderProcess
from sidecar.pipeline.encoding.routes import FreshEncoder, ReadyEncoder, Segments, choose_route


def job(*, segments: int = 1, warmable: bool = False, processes: bool = False) -> Any:
    return SimpleNamespace(
        segments=[(0, 1)] * segments,
        warmable=warmable,
        warm=object(),
        processes=object() if processes else None,
        for_processes=processes and segments < 2,
    )


@pytest.mark.parametrize(
    ("kwargs", "route", "here"),
    [
        ({}, FreshEncoder, None),
        ({"warmable": True}, ReadyEncoder, None),
        ({"processes": True}, InEncoderProcess, FreshEncoder),
        ({"processes": True, "warmable": True}, InEncoderProcess, ReadyEncoder),
        ({"segments": 2}, Segments, FreshEncoder),
        ({"segments": 2, "warmable": True, "processes": True}, Segments, ReadyEncoder),
    ],
)
def test_one_function_chooses_the_route(
    kwargs: dict[str, bool], route: type, here: type | None
) -> None:
    chosen = choose_route(cast(Any, job(**kwargs)))
    assert type(chosen) is route
    if here is not None:  # what it opens in the daemon, or falls back to there
        inner = getattr(chosen, "_here", None) or getattr(chosen, "_opener", None)
        assert type(inner) is here


def test_a_segmented_video_opens_without_headers_of_its_own() -> None:
    chosen = choose_route(cast(Any, job(segments=2)))
    assert isinstance(chosen, Segments)
    assert getattr(chosen._opener, "_headers_later") is True  # noqa: B009
    assert getattr(choose_route(cast(Any, job())), "_headers_later") is False  # noqa: B009
