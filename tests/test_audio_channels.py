"""Every channel count the daemon accepts encodes in both audio codecs (AAC in MP4, Opus in
WebM), keeps each channel where it was, and lasts as long as the video; others are refused
up front. Once 3 and 4 channel Opus failed inside the encoder (INTERNAL), and 5 and 7
channel Opus came out with channels swapped."""

from __future__ import annotations

import io
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import av
import grpc
import numpy as np
import pytest

from sidecar.api.v1 import sidecar_pb2 as pb
from sidecar.api.v1 import sidecar_pb2_grpc as pb_grpc
from sidecar.codec.audio import LAYOUTS, MAX_CHANNELS, AudioFormat
from sidecar.codec.catalogue import CodecSpec
from sidecar.codec.encoder import VideoEncoder
from sidecar.codec.frames import Limits, check_geometry
from sidecar.errors import InvalidRequest

from .helpers import Daemon

LIMITS = Limits(1000, 4096, 4096, 1 << 34)
FPS = 24
FRAMES = 24  # one second of video
WIDTH, HEIGHT = 64, 48
CONTAINERS = {"mp4": "aac", "webm": "opus"}


def freqs(channels: int) -> list[float]:
    """A distinct tone per channel, so a swap or a remix shows; the LFE channel gets a low
    one, since both encoders cut what an LFE channel carries above ~120 Hz."""
    names = [c.name for c in av.AudioLayout(LAYOUTS[channels]).channels]
    return [80.0 if name == "LFE" else 300.0 + 250.0 * i for i, name in enumerate(names)]


def tones(channels: int, rate: int, seconds: float) -> np.ndarray:
    """(samples, channels) float32 holding `freqs(channels)`."""
    t = np.arange(round(rate * seconds)) / rate
    waves = [0.3 * np.sin(2 * np.pi * f * t) for f in freqs(channels)]
    return np.stack(waves, axis=1).astype(np.float32)


def decode_audio(source: str | bytes) -> tuple[str, list[str], np.ndarray]:
    """(codec, channel names in the decoded order, (samples, channels) float32) of the
    first audio stream. A decoder may hand the channels over in the order the bitstream
    holds them, its layout naming them; or with no names (PyAV 18's FFmpeg does for
    7-channel AAC: "NONE" each), in the layout's own order."""
    handle = io.BytesIO(source) if isinstance(source, bytes) else source
    with av.open(handle) as container:
        stream = container.streams.audio[0]
        name, channels, rate = stream.codec_context.name, stream.channels, stream.sample_rate
        # Interleave first: PyAV 18's to_ndarray crashes on 8-channel planar frames.
        packed = av.AudioResampler(format="flt")
        frames = [f for frame in container.decode(stream) for f in packed.resample(frame)]
        pcm = [f.to_ndarray().reshape(-1, channels) for f in frames]
        names = [c.name for c in frames[0].layout.channels]
    assert rate == 48000  # both tests send 48 kHz, which AAC and Opus keep
    return name, names, np.concatenate(pcm)


def peak_hz(signal: np.ndarray, rate: int = 48000) -> float:
    spectrum = np.abs(np.fft.rfft(signal * np.hanning(len(signal))))
    return float(np.fft.rfftfreq(len(signal), 1 / rate)[int(np.argmax(spectrum))])


# A layout with one surround pair may come back with it named side or back: PyAV 19's
# FFmpeg decodes the 6.1 AAC it wrote (FL FR FC LFE BC SL SR) as 6.1(back), BL and BR.
# Which tone lands in which slot is still checked below.
SURROUND_PAIRS = ({"SL": "BL", "SR": "BR"}, {"BL": "SL", "BR": "SR"})


def same_names(decoded: list[str], sent: list[str]) -> list[str]:
    """`decoded` in the names of `sent`: by position where the decoder gave none, and with
    a lone surround pair renamed to the one sent."""
    if set(decoded) == {"NONE"}:  # unnamed: in the order of the layout sent
        return sent[: len(decoded)]
    for pair in SURROUND_PAIRS:
        other = set(pair.values())
        if set(pair) <= set(sent) and not other & set(sent) and other <= set(decoded):
            back = {v: k for k, v in pair.items()}
            return [back.get(name, name) for name in decoded]
    return decoded


def check_track(source: str | bytes, container: str, channels: int) -> None:
    codec, decoded, pcm = decode_audio(source)
    assert codec == CONTAINERS[container]
    sent = [c.name for c in av.AudioLayout(LAYOUTS[channels]).channels]
    names = same_names(decoded, sent)
    assert sorted(names) == sorted(sent) and pcm.shape[1] == channels
    # As long as the video, within one audio frame (AAC's 1024 samples, Opus's 960).
    assert abs(len(pcm) / 48000 - FRAMES / FPS) <= 1024 / 48000
    middle = pcm[len(pcm) // 4 : 3 * len(pcm) // 4]
    tone = dict(zip(sent, freqs(channels), strict=True))
    for i, name in enumerate(names):
        assert abs(peak_hz(middle[:, i]) - tone[name]) < 20, f"{name} moved or was remixed"


def test_a_lone_surround_pair_matches_by_either_name() -> None:
    names = [c.name for c in av.AudioLayout("6.1(back)").channels]
    sent = [c.name for c in av.AudioLayout("6.1").channels]
    assert sorted(same_names(names, sent)) == sorted(sent)
    assert same_names(names, sent)[names.index("BL")] == "SL"
    both = [c.name for c in av.AudioLayout("7.1").channels]  # two pairs: names must match
    assert same_names(both, both) == both
    assert same_names(["FL", "FR", "FC", "LFE", "BC", "BL", "BR"], both) != both


@pytest.mark.parametrize("channels", range(1, MAX_CHANNELS + 1))
@pytest.mark.parametrize("container", CONTAINERS)
def test_every_accepted_channel_count_encodes(
    tmp_path: Path, container: str, channels: int
) -> None:
    fmt = AudioFormat(48000, channels, "f32").check()
    geometry = check_geometry(WIDTH, HEIGHT, "rgb24", Fraction(FPS), LIMITS)
    out = tmp_path / f"out.{container}"
    encoder = VideoEncoder(
        str(out),
        geometry,
        CodecSpec().resolve(container),
        threads=1,
        container=container,
        audio=fmt,
    )
    encoder.set_audio(tones(channels, 48000, FRAMES / FPS))
    for _ in range(FRAMES):
        encoder.encode(np.zeros((HEIGHT, WIDTH, 3), np.uint8))
    encoder.close()
    check_track(str(out), container, channels)


@pytest.mark.parametrize("channels", [0, MAX_CHANNELS + 1, 64, 2**32 - 1])
def test_other_channel_counts_are_refused_up_front(channels: int) -> None:
    with pytest.raises(InvalidRequest) as err:
        AudioFormat(48000, channels, "f32").check()
    assert err.value.field == "audio.channels"


# -- over gRPC ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stub(daemon: Daemon) -> Iterator[tuple[pb_grpc.VideoSidecarStub, str]]:
    with grpc.insecure_channel(f"unix:{daemon.socket}") as channel:
        s = pb_grpc.VideoSidecarStub(channel)
        yield s, s.Attach(pb.AttachRequest(client_name="audio-channels")).client_token


@pytest.mark.parametrize("channels", [3, 4])
def test_webm_multichannel_over_grpc(
    stub: tuple[pb_grpc.VideoSidecarStub, str], channels: int
) -> None:
    s, token = stub
    frames = np.zeros((FRAMES, HEIGHT, WIDTH, 3), np.uint8)
    header = pb.StreamHeader(
        client_token=token,
        width=WIDTH,
        height=HEIGHT,
        pixel_format=pb.PIXEL_FORMAT_RGB24,
        fps=pb.Rational(num=FPS, den=1),
        output=pb.OutputSpec(bytes=pb.BytesOutput(), container=pb.CONTAINER_WEBM),
        audio=pb.AudioSpec(
            sample_rate=48000, channels=channels, sample_format=pb.SAMPLE_FORMAT_F32
        ),
    )
    pcm = tones(channels, 48000, FRAMES / FPS).tobytes()
    requests = [
        pb.StreamRequest(header=header),
        pb.StreamRequest(chunk=pb.StreamChunk(inline=frames.tobytes())),
        pb.StreamRequest(end=pb.StreamEnd(audio_data=[pb.AudioData(inline=pcm)])),
    ]
    chunks: dict[int, bytes] = {}
    results = []
    for event in s.EncodeStream(iter(requests), timeout=60):
        if event.HasField("chunk"):
            chunks[event.chunk.offset] = event.chunk.data
        elif event.HasField("result"):
            results.append(event.result)
    assert len(results) == 1 and results[0].frames == FRAMES
    check_track(b"".join(chunks[k] for k in sorted(chunks)), "webm", channels)
