"""Per-episode state: isolation, atomic calls, read-only reads, diffs."""

from envs.runtime import EnvInstance
from state.records import RowChange


def stock(instance, sku):
    return next(r["stock"] for r in instance.rows()["items"] if r["sku"] == sku)


def test_episodes_do_not_share_state(shop):
    first, second = EnvInstance(shop), EnvInstance(shop)
    assert first.call("reserve", {"sku": "HX-100", "qty": 3}).ok
    assert (stock(first, "HX-100"), stock(second, "HX-100")) == (1, 4)
    assert stock(EnvInstance(shop), "HX-100") == 4
    assert second.diff().changes == ()


def test_failed_write_leaves_no_partial_write(shop):
    instance = EnvInstance(shop)
    before = instance.rows()
    obs = instance.call("reserve", {"sku": "SW-310", "qty": 1})  # inserts, updates, then refuses
    assert (obs.ok, obs.error_code) == (False, "insufficient_stock")
    assert instance.rows() == before
    assert instance.diff().changes == ()


def test_crashing_write_is_an_internal_error_and_rolled_back(shop):
    instance = EnvInstance(shop)
    obs = instance.call("buggy_write", {"sku": "HX-100"})
    assert (obs.ok, obs.error_code) == (False, "internal_error")
    assert "ZeroDivisionError" in obs.message
    assert stock(instance, "HX-100") == 4


def test_read_tools_cannot_write(shop):
    instance = EnvInstance(shop)
    obs = instance.call("sneaky_read", {"sku": "HX-100"})
    assert (obs.ok, obs.error_code) == (False, "internal_error")
    assert stock(instance, "HX-100") == 4
    assert instance.call("reserve", {"sku": "HX-100", "qty": 1}).ok  # the connection is writable again


def test_tool_refusals_keep_their_code(shop):
    obs = EnvInstance(shop).call("get_item", {"sku": "ZZ-999"})
    assert (obs.ok, obs.error_code) == (False, "not_found")
    assert obs.visible == {"error": {"code": "not_found", "message": "No items record with sku='ZZ-999'."}}


def test_bad_arguments_and_unknown_tools(shop):
    instance = EnvInstance(shop)
    assert instance.call("reserve", {"sku": "HX-100", "qty": "many"}).error_code == "invalid_arguments"
    assert instance.call("reserve", {"sku": "HX-100", "qty": 1, "force": True}).error_code == "invalid_arguments"
    assert instance.call("drop_table", {}).error_code == "unknown_tool"
    assert len(instance.calls) == 3


def test_a_number_out_of_range_is_the_callers_argument_not_a_crash(shop):
    """Too large for SQLite (10**100), or for the tool's arithmetic (-2**63 taken from the stock): refused like a wrong
    type, and undone. As a crash (`internal_error`) the episode would end as an environment fault, never scored."""
    instance = EnvInstance(shop)
    for qty in (10**100, -2**63):
        obs = instance.call("reserve", {"sku": "HX-100", "qty": qty})
        assert (obs.ok, obs.error_code) == (False, "invalid_arguments")
        assert obs.message == "a number out of range (Python int too large to convert to SQLite INTEGER)"
    assert stock(instance, "HX-100") == 4 and instance.diff().changes == ()


def test_diff_against_initial_state(shop):
    instance = EnvInstance(shop)
    instance.call("reserve", {"sku": "DR-220", "qty": 2})
    assert instance.diff().changes == (
        RowChange(table="items", key="DR-220", before={"sku": "DR-220", "name": "Cordless drill", "price": 89.0, "stock": 2},
                  after={"sku": "DR-220", "name": "Cordless drill", "price": 89.0, "stock": 0}),
        RowChange(table="reservations", key="R-DR-220-1", before=None, after={"reservation_id": "R-DR-220-1", "sku": "DR-220", "qty": 2}),
    )
