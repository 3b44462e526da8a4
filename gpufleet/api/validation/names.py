"""apimachinery's name, label and value rules (``k8s.io/apimachinery/pkg/util/validation``)."""

from __future__ import annotations

import re
from collections.abc import Callable

DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_FMT = DNS1123_LABEL_FMT + "(\\." + DNS1123_LABEL_FMT + ")*"
DNS1123_SUBDOMAIN_MAX = 253
DNS1035_LABEL_FMT = "[a-z]([-a-z0-9]*[a-z0-9])?"
QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
QUALIFIED_NAME_MAX = 63
LABEL_VALUE_FMT = "(" + QUALIFIED_NAME_FMT + ")?"
LABEL_VALUE_MAX = 63
ENV_VAR_NAME_FMT = "[-._a-zA-Z][-._a-zA-Z0-9]*"
CONFIG_MAP_KEY_FMT = "[-._a-zA-Z0-9]+"
PERCENT_FMT = "[0-9]+%"
HTTP_HEADER_NAME_FMT = "[-A-Za-z0-9]+"
QUANTITY_FMT = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
TOTAL_ANNOTATION_SIZE_LIMIT = 256 * 1024
MAX_SECRET_SIZE = 1024 * 1024
MAX_INT32 = 2**31 - 1
HIGHEST_USER_PRIORITY = 1_000_000_000
SYSTEM_PRIORITY_CLASSES = {"system-cluster-critical": 2_000_000_000, "system-node-critical": 2_000_001_000}
NODE_PORT_RANGE = (30000, 32767)

_DNS1123_LABEL_RE = re.compile(DNS1123_LABEL_FMT)
_DNS1123_SUBDOMAIN_RE = re.compile(DNS1123_SUBDOMAIN_FMT)
_DNS1035_LABEL_RE = re.compile(DNS1035_LABEL_FMT)
_QUALIFIED_NAME_RE = re.compile(QUALIFIED_NAME_FMT)
_LABEL_VALUE_RE = re.compile(LABEL_VALUE_FMT)
_ENV_VAR_NAME_RE = re.compile(ENV_VAR_NAME_FMT)
_CONFIG_MAP_KEY_RE = re.compile(CONFIG_MAP_KEY_FMT)
_PERCENT_RE = re.compile(PERCENT_FMT)
_HTTP_HEADER_NAME_RE = re.compile(HTTP_HEADER_NAME_FMT)
_PORT_NAME_CHARSET_RE = re.compile("[-a-z0-9]+")
_PORT_NAME_LETTER_RE = re.compile("[a-z]")


def regex_error(msg: str, fmt: str, *examples: str) -> str:
    # Kubernetes' own wording, including its double space before "or".
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    text = msg + " (e.g. "
    for i, example in enumerate(examples):
        if i > 0:
            text += " or "
        text += f"'{example}', "
    return text + f"regex used for validation is '{fmt}')"


def max_len_error(length: int) -> str:
    return f"must be no more than {length} characters"


def inclusive_range_error(lo: int, hi: int) -> str:
    return f"must be between {lo} and {hi}, inclusive"


def _format_errors(value: str, max_len: int | None, pattern: re.Pattern[str], msg: str, fmt: str,
                   *examples: str) -> list[str]:
    """apimachinery's usual pair of checks: at most ``max_len`` characters, then the format."""
    errs = []
    if max_len is not None and len(value) > max_len:
        errs.append(max_len_error(max_len))
    if not pattern.fullmatch(value):
        errs.append(regex_error(msg, fmt, *examples))
    return errs


def is_dns1123_label(value: str) -> list[str]:
    errs = []
    if len(value) > DNS1123_LABEL_MAX:
        errs.append(max_len_error(DNS1123_LABEL_MAX))
    if not _DNS1123_LABEL_RE.fullmatch(value):
        if _DNS1123_SUBDOMAIN_RE.fullmatch(value):
            errs.append("must not contain dots")
        else:
            errs.append(
                regex_error(
                    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
                    "and must start and end with an alphanumeric character",
                    DNS1123_LABEL_FMT,
                    "my-name",
                    "123-abc",
                )
            )
    return errs


def is_dns1123_subdomain(value: str) -> list[str]:
    return _format_errors(
        value,
        DNS1123_SUBDOMAIN_MAX,
        _DNS1123_SUBDOMAIN_RE,
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
        "and must start and end with an alphanumeric character",
        DNS1123_SUBDOMAIN_FMT,
        "example.com",
    )


def is_dns1035_label(value: str) -> list[str]:
    return _format_errors(
        value,
        DNS1123_LABEL_MAX,
        _DNS1035_LABEL_RE,
        "a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
        "start with an alphabetic character, and end with an alphanumeric character",
        DNS1035_LABEL_FMT,
        "my-name",
        "abc-123",
    )


_QUALIFIED_NAME_MSG = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"


def is_qualified_name(value: str) -> list[str]:
    """Label keys, annotation keys, finalizers, resource names: ``[prefix/]name``."""
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs.extend("prefix part " + m for m in is_dns1123_subdomain(prefix))
    else:
        return [
            "a qualified name "
            + regex_error(_QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > QUALIFIED_NAME_MAX:
        errs.append("name part " + max_len_error(QUALIFIED_NAME_MAX))
    if not _QUALIFIED_NAME_RE.fullmatch(name):
        errs.append(
            "name part "
            + regex_error(_QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
        )
    return errs


def is_label_value(value: str) -> list[str]:
    return _format_errors(
        value,
        LABEL_VALUE_MAX,
        _LABEL_VALUE_RE,
        "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
        "and must start and end with an alphanumeric character",
        LABEL_VALUE_FMT,
        "MyValue",
        "my_value",
        "12345",
    )


def is_env_var_name(value: str) -> list[str]:
    errs = _format_errors(
        value,
        None,
        _ENV_VAR_NAME_RE,
        "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', "
        "or '.', and must not start with a digit",
        ENV_VAR_NAME_FMT,
        "my.env-name",
        "MY_ENV.NAME",
        "MyEnvName1",
    )
    errs.extend(_ch_dir_prefix(value))
    return errs


def is_config_map_key(value: str) -> list[str]:
    errs = _format_errors(
        value,
        DNS1123_SUBDOMAIN_MAX,
        _CONFIG_MAP_KEY_RE,
        "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
        CONFIG_MAP_KEY_FMT,
        "key.name",
        "KEY_NAME",
        "key-name",
    )
    errs.extend(_ch_dir_prefix(value))
    return errs


def _ch_dir_prefix(value: str) -> list[str]:
    if value == ".":
        return ["must not be '.'"]
    if value == "..":
        return ["must not be '..'"]
    if value.startswith(".."):
        return ["must not start with '..'"]
    return []


def is_valid_port_num(port: int) -> list[str]:
    return [] if 1 <= port <= 65535 else [inclusive_range_error(1, 65535)]


def is_valid_port_name(port: str) -> list[str]:
    """An IANA service name: at most 15 of [-a-z0-9], at least one letter, no '--', no edge '-'."""
    errs = []
    if len(port) > 15:
        errs.append(max_len_error(15))
    if not _PORT_NAME_CHARSET_RE.fullmatch(port):
        errs.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if not _PORT_NAME_LETTER_RE.search(port):
        errs.append("must contain at least one letter (a-z)")
    if "--" in port:
        errs.append("must not contain consecutive hyphens")
    if port and (port[0] == "-" or port[-1] == "-"):
        errs.append("must not begin or end with a hyphen")
    return errs


def is_valid_percent(value: str) -> list[str]:
    if _PERCENT_RE.fullmatch(value):
        return []
    return [
        regex_error(
            "a valid percent string must be a numeric string followed by an ending '%'",
            PERCENT_FMT,
            "1%",
            "93%",
        )
    ]


def is_valid_path_segment_name(name: str) -> list[str]:
    if name in (".", ".."):
        return [f"may not be '{name}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in name]


def _mask_trailing_dash(name: str) -> str:
    # A generateName prefix may end in '-': the generated suffix makes the name valid.
    return name[:-1] + "a" if len(name) > 1 and name.endswith("-") else name


NameFn = Callable[[str, bool], list[str]]


def name_is_dns_subdomain(name: str, prefix: bool) -> list[str]:
    return is_dns1123_subdomain(_mask_trailing_dash(name) if prefix else name)


def name_is_dns_label(name: str, prefix: bool) -> list[str]:
    return is_dns1123_label(_mask_trailing_dash(name) if prefix else name)


def name_is_dns1035_label(name: str, prefix: bool) -> list[str]:
    return is_dns1035_label(_mask_trailing_dash(name) if prefix else name)
