from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.api.quantity import (
    add,
    compare,
    cpu_millis,
    fits,
    format_quantity,
    parse_quantity,
    sub,
    sum_resources,
    to_int_bytes,
)

Ki, Mi, Gi = 1024, 1024**2, 1024**3


# Canonical examples from the Kubernetes documentation ("Resource units in Kubernetes",
# "Meaning of memory") and from apimachinery's quantity tests.
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("1", 1),
        ("0.1", Fraction(1, 10)),
        ("100m", Fraction(1, 10)),
        ("500m", Fraction(1, 2)),
        ("0.5", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        ("2", 2),
        ("128974848", 128974848),
        ("129e6", 129_000_000),
        ("129M", 129_000_000),
        ("128974848000m", 128974848),
        ("123Mi", 128974848),
        ("1Ki", Ki),
        ("1Mi", Mi),
        ("1Gi", Gi),
        ("1.5Gi", 3 * Gi // 2),
        ("1Ti", 1024**4),
        ("1Pi", 1024**5),
        ("1Ei", 1024**6),
        ("1k", 1000),
        ("1M", 10**6),
        ("1G", 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),
        ("1n", Fraction(1, 10**9)),
        ("1u", Fraction(1, 10**6)),
        ("1e3", 1000),
        ("1E3", 1000),
        ("1e+3", 1000),
        ("1E-3", Fraction(1, 1000)),
        ("1.5e3", 1500),
        ("+5", 5),
        ("-5", -5),
        ("-1.5Gi", -3 * Gi // 2),
        ("5.", 5),
        (".5", Fraction(1, 2)),
        ("1.G", 10**9),
        ("0.9n", Fraction(1, 10**9)),
        ("0.1n", Fraction(1, 10**9)),
        ("1.01n", Fraction(2, 10**9)),
        ("-0.5n", Fraction(-1, 10**9)),
        ("18446744073709551616", 2**64),
        ("  1Gi ", Gi),
        ("0000123", 123),
    ],
)
def test_parse_canonical_examples(text, expected):
    assert parse_quantity(text) == expected


def test_docs_memory_forms_are_the_same_value():
    # "128974848, 128974848000m and 123Mi" all mean the same number of bytes.
    assert parse_quantity("128974848") == parse_quantity("128974848000m") == parse_quantity("123Mi")


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        " ",
        ".",
        "+",
        "-",
        "abc",
        "1K",  # decimal kilo is lower-case k; upper-case K only exists as Ki
        "1KB",
        "1Gb",
        "1gi",
        "1 Gi",
        "1e",
        "1e3.5",
        "1.2.3",
        "1,000",
        "--1",
        "1Mi3",
        "1mi",
        "0x10",
        "1µ",
        "١",  # a non-ASCII digit
        "1e999999",
    ],
)
def test_parse_rejects_garbage_with_helpful_message(garbage):
    with pytest.raises(ValueError) as info:
        parse_quantity(garbage)
    message = str(info.value)
    assert "invalid quantity" in message
    assert "500m" in message and "Gi" in message


@pytest.mark.parametrize("bad", [True, None, [1], float("nan"), float("inf"), Decimal("NaN")])
def test_parse_rejects_non_quantities(bad):
    with pytest.raises(ValueError):
        parse_quantity(bad)


def test_parse_numbers():
    assert parse_quantity(2) == 2
    assert parse_quantity(0.1) == Fraction(1, 10)
    assert parse_quantity(0.5) == Fraction(1, 2)
    assert parse_quantity(Decimal("0.25")) == Fraction(1, 4)
    assert parse_quantity(Fraction(3, 2)) == Fraction(3, 2)


def test_many_small_requests_add_up_exactly():
    assert sum(parse_quantity("100m") for _ in range(10)) == 1


@pytest.mark.parametrize(
    ("text", "millis"),
    [
        ("1", 1000),
        ("100m", 100),
        ("0.5", 500),
        ("1.5", 1500),
        ("1u", 1),
        ("1n", 1),
        ("0", 0),
        ("2.0001", 2001),
    ],
)
def test_cpu_millis_rounds_up(text, millis):
    assert cpu_millis(text) == millis


@pytest.mark.parametrize(
    ("text", "count"),
    [("1Gi", Gi), ("400m", 1), ("1.5", 2), ("129e6", 129_000_000), ("0", 0), ("1", 1)],
)
def test_to_int_bytes_rounds_up(text, count):
    # "400m" of memory is 0.4 bytes: the docs warn about exactly this mistake.
    assert to_int_bytes(text) == count


@pytest.mark.parametrize(
    ("value", "kind", "text"),
    [
        ("1500m", "cpu", "1500m"),
        (Fraction(3, 2), "cpu", "1500m"),
        (2, "cpu", "2"),
        ("2000m", "cpu", "2"),
        ("1k", "cpu", "1000"),
        ("0", "cpu", "0"),
        ("1u", "cpu", "1u"),
        ("1500500u", "cpu", "1500500u"),
        ("1Gi", "memory", "1Gi"),
        ("1.5Gi", "memory", "1536Mi"),
        (Gi + 1, "memory", "1073741825"),
        ("1G", "memory", "1000000000"),
        (512, "memory", "512"),
        ("1024", "memory", "1Ki"),
        ("0.5", "memory", "1"),
        ("0", "memory", "0"),
        (1000, "plain", "1k"),
        (1500, "plain", "1500"),
        ("1.5", "plain", "1500m"),
        (4, "plain", "4"),
        ("2e6", "plain", "2M"),
        ("1Ei", "plain", "1152921504606846976"),
        ("-1.5", "plain", "-1500m"),
    ],
)
def test_format_quantity(value, kind, text):
    assert format_quantity(value, kind) == text


def test_format_quantity_unknown_kind():
    with pytest.raises(ValueError, match="cpu"):
        format_quantity(1, "disk")  # type: ignore[arg-type]


@given(st.integers(min_value=0, max_value=10**15), st.sampled_from(["cpu", "plain"]))
def test_format_roundtrips_millis(millis, kind):
    value = Fraction(millis, 1000)
    assert parse_quantity(format_quantity(value, kind)) == value


@given(st.integers(min_value=0, max_value=2**70))
def test_format_roundtrips_bytes(count):
    assert parse_quantity(format_quantity(count, "memory")) == count


@given(
    st.integers(min_value=-(10**12), max_value=10**12),
    st.integers(min_value=0, max_value=6),
    st.sampled_from(["", "m", "k", "M", "Ki", "Mi", "Gi"]),
)
def test_parse_matches_arithmetic(mantissa, decimals, suffix):
    digits = str(abs(mantissa)).rjust(decimals + 1, "0")
    number = f"{digits[: len(digits) - decimals]}.{digits[len(digits) - decimals :]}" if decimals else digits
    text = f"{'-' if mantissa < 0 else ''}{number}{suffix}"
    multiplier = {"": 1, "m": Fraction(1, 1000), "k": 1000, "M": 10**6, "Ki": Ki, "Mi": Mi, "Gi": Gi}[suffix]
    expected = Fraction(mantissa, 10**decimals) * multiplier
    assert parse_quantity(text) == expected


@given(st.text(max_size=12))
def test_parse_only_raises_value_error(text):
    try:
        result = parse_quantity(text)
    except ValueError:
        return
    assert isinstance(result, Fraction)


def test_compare():
    assert compare("1Gi", "1G") == 1
    assert compare("1000m", "1") == 0
    assert compare("100m", 1) == -1


def test_sum_add_sub():
    totals = sum_resources([{"cpu": "500m", "memory": "1Gi"}, {"cpu": "1.5", "nvidia.com/gpu": "1"}, None])
    assert totals == {"cpu": 2, "memory": Gi, "nvidia.com/gpu": 1}
    assert add({"cpu": "1"}, {"cpu": "250m", "memory": "1Mi"}) == {"cpu": Fraction(5, 4), "memory": Mi}
    assert sub({"cpu": "1"}, {"cpu": "250m", "memory": "1Mi"}) == {"cpu": Fraction(3, 4), "memory": -Mi}


def test_sum_names_bad_resource():
    with pytest.raises(ValueError, match="'memory'"):
        sum_resources([{"cpu": "1", "memory": "lots"}])


def test_fits():
    free = {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}
    assert fits({"cpu": "1500m", "memory": "4Gi"}, free) == []
    assert fits({"cpu": "2500m", "memory": "5Gi", "nvidia.com/gpu": "1"}, free) == ["cpu", "memory"]
    assert fits({"nvidia.com/gpu": "2"}, free) == ["nvidia.com/gpu"]
    # A resource the node does not have at all: insufficient unless nothing is asked.
    assert fits({"example.com/fpga": "1"}, free) == ["example.com/fpga"]
    assert fits({"example.com/fpga": "0"}, free) == []
    assert fits({}, free) == []
    assert fits(None, None) == []


def test_whole_amount_rounds_up_cpu_to_millicores_and_the_rest_to_units() -> None:
    from fractions import Fraction

    from gpufleet.api.quantity import whole_amount

    assert whole_amount("cpu", "0.5m") == 1
    assert whole_amount("cpu", "1.5") == 1500
    assert whole_amount("memory", "1.5") == 2
    assert whole_amount("nvidia.com/gpu", 2) == 2
    assert whole_amount("cpu", Fraction(1, 1000)) == 1
