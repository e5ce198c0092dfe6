from __future__ import annotations

import pytest

from sidecar.errors import Cancelled, InvalidRequest, LeaseBusy, LeaseNotFound, OutOfRange
from sidecar.pool.leases import LeaseTable, check_tag
from sidecar.pool.tags import MAX_WITHDRAWN

MiB = 1024 * 1024


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def table(clock: Clock | None = None, slabs: int = 2, **kw: object) -> LeaseTable:
    return LeaseTable(slabs, 4 * MiB, ttl=10.0, clock=clock or Clock(), **kw)  # type: ignore[arg-type]


def test_grant_fills_slabs_in_order_and_never_spans() -> None:
    t = table()
    a = t.grant("c", 3 * MiB)
    b = t.grant("c", 3 * MiB)
    assert a is not None and b is not None
    assert (a.slab_id, b.slab_id) == (0, 1)
    assert t.grant("c", 2 * MiB) is None  # 2 MiB free in all, but 1 MiB per slab
    assert t.grant("c", MiB) is not None


def test_ids_are_128_bit_random_hex() -> None:
    t = table()
    ids = {t.grant("c", 4096).id for _ in range(200)}  # type: ignore[union-attr]
    assert len(ids) == 200
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_too_large_or_empty() -> None:
    t = table()
    with pytest.raises(OutOfRange):
        t.grant("c", 4 * MiB + 1)
    with pytest.raises(OutOfRange):
        t.grant("c", 0)


def test_owner_isolation() -> None:
    t = table()
    lease = t.grant("alice", 4096)
    assert lease is not None
    with pytest.raises(LeaseNotFound):
        t.lookup("bob", lease.id)
    with pytest.raises(LeaseNotFound):
        t.release("bob", lease.id)
    with pytest.raises(LeaseNotFound):
        t.take("bob", [lease.id])
    t.release("alice", lease.id)
    with pytest.raises(LeaseNotFound):
        t.lookup("alice", lease.id)


def test_take_is_all_or_nothing() -> None:
    t = table()
    a = t.grant("c", 4096)
    assert a is not None
    with pytest.raises(LeaseNotFound):
        t.take("c", [a.id, "missing"])
    assert not a.encoding
    taken = t.take("c", [a.id, a.id])
    assert taken == [a] and a.encoding
    with pytest.raises(LeaseBusy):
        t.take("c", [a.id])


def test_a_lease_released_while_an_encode_holds_it_is_freed_when_the_encode_lets_go() -> None:
    """Consumed or given back, a lease its client released is freed; one it did not
    release comes back to it with a fresh TTL."""
    t = table()
    consumed, given_back, kept = (t.grant("c", 4096) for _ in range(3))
    assert consumed is not None and given_back is not None and kept is not None
    t.take("c", [consumed.id, given_back.id, kept.id])
    t.release("c", consumed.id)
    t.release("c", given_back.id)
    assert len(t) == 3  # the encode still reads them
    t.free([consumed])
    t.untake([given_back, kept])
    assert len(t) == 1 and t.lookup("c", kept.id) is kept and not kept.encoding
    with pytest.raises(LeaseNotFound):
        t.release("c", given_back.id)
    assert t.usage().leased_bytes == kept.size


def test_expiry_skips_leases_in_an_encode() -> None:
    clock = Clock()
    t = table(clock)
    held = t.grant("c", MiB)
    busy = t.grant("c", MiB)
    assert held is not None and busy is not None
    t.take("c", [busy.id])
    clock.now += 9.9
    assert t.expire() == []
    clock.now += 0.2
    assert t.expire() == [held]
    assert t.expired == 1 and len(t) == 1
    t.free([busy])
    assert t.usage().leased_bytes == 0


def test_untake_gives_a_fresh_ttl() -> None:
    clock = Clock()
    t = table(clock)
    lease = t.grant("c", MiB)
    assert lease is not None
    t.take("c", [lease.id])
    clock.now += 20  # in an encode: no expiry
    assert t.expire() == []
    t.untake([lease])
    assert not lease.encoding
    clock.now += 9
    assert t.expire() == []  # the TTL starts again when given back
    t.release("c", lease.id)


def test_free_is_idempotent_and_notifies() -> None:
    calls = []
    t = table(on_free=lambda: calls.append(1))
    lease = t.grant("c", MiB)
    assert lease is not None
    t.free([lease])
    t.free([lease])
    assert calls == [1]
    assert t.usage().leased_bytes == 0


def test_usage() -> None:
    t = table(slabs=3)
    t.grant("c", 4 * MiB)
    t.grant("c", 1)
    u = t.usage()
    assert (u.slabs, u.total_bytes, u.leased_bytes, u.active_leases) == (
        3,
        12 * MiB,
        4 * MiB + 4096,
        2,
    )
    assert u.largest_free == 4 * MiB


def test_a_call_from_the_owner_renews_its_held_leases() -> None:
    clock = Clock()
    t = table(clock)
    mine, theirs = t.grant("me", 4096), t.grant("them", 4096)
    assert mine is not None and theirs is not None
    for _ in range(5):  # a client that keeps calling never loses its lease
        clock.now += 8
        t.renew("me")
        assert t.expire() == [] or t.lookup("me", mine.id)
    assert t.lookup("me", mine.id) is mine
    with pytest.raises(LeaseNotFound):  # the silent client's lease was reclaimed
        t.lookup("them", theirs.id)
    clock.now += 11
    assert t.expire() == [mine]
    assert t.owners() == set()


@pytest.mark.parametrize("kind", [{"spare": True}, {"in_reply": True}])
def test_a_lease_handed_over_in_a_result_is_not_renewed_until_its_client_uses_it(
    kind: dict[str, bool],
) -> None:
    """The result that carried it may never have been read: the client's other calls
    must not keep it for good. Once the client puts it to use, it is renewed as any."""
    clock = Clock()
    t = table(clock)
    lost, used = t.grant("me", 4096, **kind), t.grant("me", 4096, **kind)
    assert lost is not None and used is not None
    clock.now += 6
    t.take("me", [used.id])
    t.untake([used])  # the encode was refused: the client holds it again
    for _ in range(3):
        clock.now += 3
        t.renew("me")
    assert t.expire() == [lost]  # a TTL after it was granted, whatever the calls
    clock.now += 8
    t.renew("me")
    assert t.expire() == [] and t.lookup("me", used.id) is used


# -- tags: releasing a lease whose grant never reached its client -------------------------


def test_a_tagged_lease_is_released_by_its_tag() -> None:
    t = table()
    lease = t.grant("a", 4096, tag="req-1")
    assert lease is not None
    t.release_tagged("b", "req-1")  # another client's tag names nothing of "a"'s
    assert len(t) == 1
    t.release_tagged("a", "req-1")
    assert len(t) == 0
    assert t.grant("a", 4096, tag="req-1") is not None  # freed, so the tag names nothing


def test_a_tag_released_before_its_grant_refuses_the_grant_for_a_ttl() -> None:
    clock = Clock()
    t = table(clock)
    t.release_tagged("a", "late")
    with pytest.raises(Cancelled, match="withdrawn"):
        t.grant("a", 4096, tag="late")
    assert t.grant("b", 4096, tag="late") is not None  # tags are per client
    clock.now += 10.1
    assert t.grant("a", 4096, tag="late") is not None


def test_a_tag_names_one_live_lease() -> None:
    t = table()
    assert t.grant("a", 4096, tag="x") is not None
    with pytest.raises(InvalidRequest, match="tag"):
        t.grant("a", 4096, tag="x")


def test_a_tagged_lease_in_an_encode_is_freed_when_the_encode_lets_go() -> None:
    t = table()
    lease = t.grant("a", 4096, tag="x")
    assert lease is not None
    taken = t.take("a", [lease.id])
    t.release_tagged("a", "x")
    assert len(t) == 1
    t.untake(taken)  # it would have gone back to the client: released, it is freed
    assert len(t) == 0


def test_withdrawn_tags_are_bounded_for_each_client_and_forgotten_after_a_ttl() -> None:
    clock = Clock()
    t = table(clock)
    t.release_tagged("victim", "lost")
    for n in range(MAX_WITHDRAWN * 100):  # another client's flood
        t.release_tagged("flood", f"t{n}")
    with pytest.raises(Cancelled):  # not pushed out by the flood
        t.grant("victim", 4096, tag="lost")
    assert t.grant("flood", 4096, tag="t0") is not None  # its own oldest forgotten
    with pytest.raises(Cancelled):
        t.grant("flood", 4096, tag=f"t{MAX_WITHDRAWN * 100 - 1}")
    clock.now += 10.1
    t.expire()
    assert t._tags._withdrawn._until == {}  # nothing kept past the TTL


@pytest.mark.parametrize("tag", ["", "a", "A-z_09", "x" * 64])
def test_tags_that_are_taken(tag: str) -> None:
    check_tag(tag)


@pytest.mark.parametrize("tag", ["x" * 65, "a b", "a/b", "../x", "\x1b[2J", "é", "a\nb", "\x00"])
def test_tags_that_are_refused(tag: str) -> None:
    with pytest.raises(InvalidRequest, match="tag"):
        check_tag(tag)
