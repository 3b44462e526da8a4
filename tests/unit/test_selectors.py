import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.api.selectors import (
    FieldRequirement,
    FieldSelector,
    LabelSelector,
    Operator,
    Requirement,
    SelectorError,
    escape_field_value,
    field_value,
    label_value_errors,
    parse_field_selector,
    parse_label_selector,
    qualified_name_errors,
)
from gpufleet.api.validation import validate_labels

WEB = {"app": "web", "tier": "fe", "env": "prod"}
DB = {"app": "db", "tier": "be"}


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", []),
        ("   ", []),
        ("app=web", [("app", Operator.EQUALS, ("web",))]),
        ("app==web", [("app", Operator.DOUBLE_EQUALS, ("web",))]),
        ("app!=web", [("app", Operator.NOT_EQUALS, ("web",))]),
        ("app=", [("app", Operator.EQUALS, ("",))]),
        ("tier in (fe,be)", [("tier", Operator.IN, ("be", "fe"))]),
        ("tier notin (db)", [("tier", Operator.NOT_IN, ("db",))]),
        ("gpu", [("gpu", Operator.EXISTS, ())]),
        ("!gpu", [("gpu", Operator.DOES_NOT_EXIST, ())]),
        ("replicas>2", [("replicas", Operator.GREATER_THAN, ("2",))]),
        ("replicas<2", [("replicas", Operator.LESS_THAN, ("2",))]),
        (
            "  tier  in ( fe , be ) ,  !canary , app = web ",
            [
                ("app", Operator.EQUALS, ("web",)),
                ("canary", Operator.DOES_NOT_EXIST, ()),
                ("tier", Operator.IN, ("be", "fe")),
            ],
        ),
        # From the apimachinery grammar comment: empty slots are the empty value.
        (
            "x in (foo,,baz),y,z notin ()",
            [
                ("x", Operator.IN, ("", "baz", "foo")),
                ("y", Operator.EXISTS, ()),
                ("z", Operator.NOT_IN, ("",)),
            ],
        ),
        ("x in (,a)", [("x", Operator.IN, ("", "a"))]),
        ("x in (a,)", [("x", Operator.IN, ("", "a"))]),
        # "in"/"notin" are ordinary words where a key or value is expected.
        ("in in (in,notin)", [("in", Operator.IN, ("in", "notin"))]),
        ("example.com/gpu-model=A100", [("example.com/gpu-model", Operator.EQUALS, ("A100",))]),
        (
            "nvidia.com/gpu.product in (NVIDIA-H100-80GB-HBM3)",
            [("nvidia.com/gpu.product", Operator.IN, ("NVIDIA-H100-80GB-HBM3",))],
        ),
        ("a=b\t,\nb=c", [("a", Operator.EQUALS, ("b",)), ("b", Operator.EQUALS, ("c",))]),
    ],
)
def test_parse(text, expected):
    selector = parse_label_selector(text)
    assert [(r.key, r.operator, r.values) for r in selector.requirements] == expected


def test_parse_sorts_by_key_and_renders():
    selector = parse_label_selector("tier in (fe,be),app=web,!canary")
    assert str(selector) == "app=web,!canary,tier in (be,fe)"
    assert parse_label_selector(str(selector)) == selector


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("a b", "found 'b', expected: in, notin, =, ==, !=, gt, lt"),
        ("a=b,", "found '', expected: identifier after ','"),
        (",a=b", "found ',', expected: !, identifier, or 'end of string'"),
        ("a=b c", "found 'c', expected: ',' or 'end of string'"),
        ("a in b", "found 'b', expected: '('"),
        ("a in (b", "found '', expected: ',' or ')'"),
        ("a in (b c)", "found 'c', expected: ',' or ')'"),
        ("a in", "found '', expected: '('"),
        ("a=(b)", "found '(', expected: identifier"),
        ("!", "found '', expected: identifier"),
        ("!=a", "found '!=', expected: !, identifier, or 'end of string'"),
        ("!!a", "found '!', expected: identifier"),
        ("a===b", "found '=', expected: identifier"),
        ("-a=b", 'key: Invalid value: "-a"'),
        ("a=-b", 'values[0][a]: Invalid value: "-b"'),
        ("a/b/c=d", "a qualified name must consist of"),
        ("Example.com/a=b", "prefix part a lowercase RFC 1123 subdomain"),
        ("/a=b", "prefix part must be non-empty"),
        ("a/=b", "name part must be non-empty"),
        ("k" * 64 + "=v", "name part must be no more than 63 characters"),
        ("k=" + "v" * 64, "must be no more than 63 characters"),
        ("a>b", "for 'Gt', 'Lt' operators, the value must be an integer"),
        ("a in (x y)", "found 'y', expected: ',' or ')'"),
        ("ключ=1", 'key: Invalid value: "ключ"'),
    ],
)
def test_parse_errors_name_the_bad_part(text, fragment):
    with pytest.raises(SelectorError) as info:
        parse_label_selector(text)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_requirement_errors_are_prefixed_like_kubernetes():
    with pytest.raises(SelectorError, match=r"^unable to parse requirement: key: Invalid value"):
        parse_label_selector("app=web,-bad")


def test_parse_rejects_non_string():
    with pytest.raises(SelectorError):
        parse_label_selector(None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- matching


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    [
        ("", {}, True),
        ("", WEB, True),
        ("app=web", WEB, True),
        ("app=web", DB, False),
        ("app=web", {}, False),
        ("app==web", WEB, True),
        ("app!=web", WEB, False),
        ("app!=web", DB, True),
        ("app!=web", {}, True),  # a missing label is "not equal"
        ("tier in (fe,be)", WEB, True),
        ("tier in (fe,be)", {"tier": "x"}, False),
        ("tier in (fe,be)", {}, False),
        ("tier notin (fe)", WEB, False),
        ("tier notin (fe)", DB, True),
        ("tier notin (fe)", {}, True),  # a missing label is "not in"
        ("env", WEB, True),
        ("env", DB, False),
        ("!env", WEB, False),
        ("!env", DB, True),
        ("app=web,env=prod", WEB, True),
        ("app=web,env=dev", WEB, False),
        ("x=", {"x": ""}, True),
        ("x=", {}, False),
        ("n>2", {"n": "3"}, True),
        ("n>2", {"n": "2"}, False),
        ("n>2", {"n": "abc"}, False),
        ("n>2", {}, False),
        ("n<2", {"n": "-5"}, True),
    ],
)
def test_matches(text, labels, expected):
    assert parse_label_selector(text).matches(labels) is expected


def test_matches_none_labels():
    assert parse_label_selector("").matches(None)
    assert parse_label_selector("!gpu").matches(None)
    assert not parse_label_selector("gpu").matches(None)


# --------------------------------------------------------------------------- structured form


def test_from_dict_match_labels_renders_like_scale_status():
    selector = LabelSelector.from_dict({"matchLabels": {"app": "web"}})
    assert str(selector) == "app=web"
    assert selector.matches(WEB) and not selector.matches(DB)


def test_from_dict_expressions():
    selector = LabelSelector.from_dict(
        {
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["fe", "be"]},
                {"key": "env", "operator": "NotIn", "values": ["dev"]},
                {"key": "gpu", "operator": "DoesNotExist"},
                {"key": "zone", "operator": "Exists", "values": []},
            ],
        }
    )
    assert str(selector) == "app=web,env notin (dev),!gpu,tier in (be,fe),zone"
    assert selector.matches({**WEB, "zone": "a"})
    assert not selector.matches(WEB)
    assert parse_label_selector(str(selector)).matches({**WEB, "zone": "a"})


def test_nil_versus_empty():
    nil = LabelSelector.from_dict(None)
    empty = LabelSelector.from_dict({})
    assert nil == LabelSelector.nothing()
    assert empty == LabelSelector.everything()
    assert not nil.matches(WEB) and not nil.matches({})
    assert empty.matches(WEB) and empty.matches({})
    assert empty.empty() and not nil.empty()
    assert nil.matches_nothing() and not empty.matches_nothing()
    assert LabelSelector.from_dict({"matchLabels": {}, "matchExpressions": []}).empty()
    assert LabelSelector.from_dict({"matchLabels": None}).empty()
    assert str(nil) == ""
    assert nil.add(Requirement.new("a", "=", ["b"])) == nil


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        (
            {"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["b"]}]},
            "not a valid label selector operator",
        ),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}, "values set can't be empty"),
        (
            {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
            "values set must be empty",
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]},
            "not a valid label selector operator",
        ),
        ({"matchExpressions": [{"operator": "Exists"}]}, "matchExpressions[0].key"),
        (
            {"matchExpressions": [{"key": "-a", "operator": "Exists"}]},
            'matchExpressions[0].key: Invalid value: "-a"',
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "values": ["-x"]}]},
            "matchExpressions[0].values[0][a]",
        ),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": "x"}]}, "list of strings"),
        ({"matchExpressions": "a"}, "must be a list"),
        ({"matchLabels": {"app": "-web"}}, "matchLabels[app]: Invalid value"),
        ({"matchLabels": {"-app": "web"}}, 'matchLabels: Invalid value: "-app"'),
        ({"matchLabels": {"app": 1}}, "must be a string"),
        ({"matchLabels": ["app"]}, "matchLabels"),
        ("app=web", "must be an object"),
    ],
)
def test_from_dict_errors(obj, fragment):
    with pytest.raises(SelectorError) as info:
        LabelSelector.from_dict(obj)
    assert fragment in str(info.value)


def test_from_set():
    selector = LabelSelector.from_set({"tier": "fe", "app": "web"})
    assert str(selector) == "app=web,tier=fe"
    assert selector.matches(WEB) and not selector.matches(DB)
    assert LabelSelector.from_set(None).empty()
    assert LabelSelector.from_set({}).matches(DB)


def test_requires_exact_match():
    selector = parse_label_selector("app=web,tier in (fe),env in (a,b),!x")
    assert selector.requires_exact_match("app") == "web"
    assert selector.requires_exact_match("tier") == "fe"
    assert selector.requires_exact_match("env") is None
    assert selector.requires_exact_match("x") is None
    assert selector.requires_exact_match("missing") is None


def test_requirement_new_validation():
    assert Requirement.new("a", Operator.IN, ["y", "x", "x"]).values == ("x", "y")
    with pytest.raises(SelectorError, match="exact-match compatibility requires one single value"):
        Requirement.new("a", "=", ["x", "y"])
    with pytest.raises(SelectorError, match="exactly one value"):
        Requirement.new("a", "gt", [])
    with pytest.raises(SelectorError, match="Unsupported value"):
        Requirement.new("a", "~", ["x"])


def test_validation_helpers():
    assert qualified_name_errors("app.kubernetes.io/name") == []
    assert qualified_name_errors("MyName") == []
    assert qualified_name_errors("a" * 63) == []
    assert qualified_name_errors("a" * 64)
    assert qualified_name_errors("x" * 254 + "/a")
    assert qualified_name_errors("a_") and qualified_name_errors("_a")
    assert label_value_errors("") == []
    assert label_value_errors("my_value") == []
    assert label_value_errors("a b")
    assert label_value_errors("v" * 64)


def test_selector_key_errors_read_as_the_object_validators_and_kubernetes_write_them():
    # apimachinery's RegexError joins its examples with "',  or '" (two spaces); the selector
    # parser once wrote one space, unlike the same rule checked on an object's labels.
    with pytest.raises(SelectorError) as err:
        parse_label_selector("a_=b")
    assert str(err.value) == (
        'unable to parse requirement: key: Invalid value: "a_": name part must consist of alphanumeric '
        "characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  "
        "or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
    )
    errs: list = []
    validate_labels({"a_": "b"}, "metadata.labels", errs)
    assert str(err.value).endswith(": " + errs[0].detail)


_label_word = st.from_regex(r"[a-z0-9]([a-z0-9._-]{0,8}[a-z0-9])?", fullmatch=True)


@st.composite
def _requirements(draw):
    key = draw(_label_word)
    op = draw(st.sampled_from(list(Operator)))
    if op in (Operator.EXISTS, Operator.DOES_NOT_EXIST):
        values = []
    elif op in (Operator.IN, Operator.NOT_IN):
        values = draw(st.lists(st.one_of(st.just(""), _label_word), min_size=1, max_size=3))
    elif op in (Operator.GREATER_THAN, Operator.LESS_THAN):
        values = [str(draw(st.integers(min_value=0, max_value=10**6)))]
    else:
        values = [draw(st.one_of(st.just(""), _label_word))]
    return Requirement.new(key, op, values)


@given(
    st.lists(_requirements(), max_size=5),
    st.dictionaries(
        _label_word, st.one_of(st.just(""), _label_word, st.integers(0, 99).map(str)), max_size=5
    ),
)
def test_string_form_roundtrips(requirements, labels):
    selector = LabelSelector(requirements)
    reparsed = parse_label_selector(str(selector))
    assert reparsed.matches(labels) == selector.matches(labels)
    assert str(reparsed) == str(selector)


@given(st.text(alphabet=st.sampled_from(list("ab=!(),<> in\tx-")), max_size=20))
def test_parser_only_raises_selector_error(text):
    try:
        parse_label_selector(text)
    except SelectorError:
        pass


# --------------------------------------------------------------------------- field selectors

POD = {
    "metadata": {"name": "web-0", "namespace": "default", "uid": "u-1"},
    "spec": {"nodeName": "node-1", "hostNetwork": False, "priority": 10},
    "status": {"phase": "Running"},
}


def test_field_parse_and_requirements():
    selector = parse_field_selector("status.phase!=Failed,metadata.name==web-0,spec.nodeName=node-1")
    assert selector.requirements == [
        ("metadata.name", "=", "web-0"),
        ("spec.nodeName", "=", "node-1"),
        ("status.phase", "!=", "Failed"),
    ]
    assert isinstance(selector.requirements[0], FieldRequirement)
    assert selector.fields() == ["metadata.name", "spec.nodeName", "status.phase"]
    assert selector.matches(POD)
    assert str(selector) == "metadata.name=web-0,spec.nodeName=node-1,status.phase!=Failed"


def test_field_describe_events_selector():
    # What kubectl describe sends for a pod's events.
    text = "involvedObject.name=web-0,involvedObject.namespace=default,involvedObject.uid=u-1"
    selector = parse_field_selector(text)
    event = {"involvedObject": {"name": "web-0", "namespace": "default", "uid": "u-1", "kind": "Pod"}}
    assert selector.matches(event)
    assert not selector.matches({"involvedObject": {"name": "web-1", "namespace": "default", "uid": "u-1"}})
    assert selector.fields() == ["involvedObject.name", "involvedObject.namespace", "involvedObject.uid"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", True),
        (",", True),
        ("metadata.name=web-0", True),
        ("metadata.name=web-1", False),
        ("metadata.name!=web-1", True),
        ("spec.nodeName=", False),
        ("spec.missing=", True),  # a missing field reads as ""
        ("spec.missing!=x", True),
        ("spec.hostNetwork=false", True),
        ("spec.hostNetwork=true", False),
        ("spec.priority=10", True),
        ("spec=", True),  # an object has no scalar value
        ("metadata.name.deeper=", True),
        ("status.phase=Running,metadata.namespace=default", True),
        ("status.phase=Running,metadata.namespace=other", False),
    ],
)
def test_field_matches(text, expected):
    assert parse_field_selector(text).matches(POD) is expected


def test_field_escapes():
    selector = parse_field_selector(r"metadata.annotations.note=a\,b\=c\\d,metadata.name=x")
    assert selector.requirements[0] == ("metadata.annotations.note", "=", "a,b=c\\d")
    assert selector.matches({"metadata": {"name": "x", "annotations": {"note": "a,b=c\\d"}}})
    assert parse_field_selector(str(selector)) == selector


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("metadata.name", "can't understand 'metadata.name'"),
        ("a=b,c", "can't understand 'c'"),
        ("a=b=c", "unescaped character in value: ="),
        (r"a=b\x", r"invalid escape sequence: \x"),
        ("a=b\\", "invalid escape sequence: \\"),
        ("=b", "has no field name"),
        ("a=b\\,c=d", "unescaped character in value: ="),
    ],
)
def test_field_errors(text, fragment):
    with pytest.raises(SelectorError) as info:
        parse_field_selector(text)
    assert fragment in str(info.value)


def test_field_operator_precedence():
    # "!=" is found before "=": the field name is never "a!".
    assert parse_field_selector("a!=b").requirements == [("a", "!=", "b")]
    assert parse_field_selector("a==b").requirements == [("a", "=", "b")]
    with pytest.raises(SelectorError):
        parse_field_selector("a===b")


def test_only_name():
    assert parse_field_selector("metadata.name=web").only_name() == "web"
    assert parse_field_selector("metadata.name==web").only_name() == "web"
    assert parse_field_selector("metadata.name!=web").only_name() is None
    assert parse_field_selector("metadata.name=web,status.phase=Running").only_name() is None
    assert parse_field_selector("").only_name() is None
    assert parse_field_selector("spec.nodeName=web").only_name() is None


def test_field_helpers():
    selector = parse_field_selector("spec.nodeName=n1,status.phase!=Failed")
    assert selector.requires_exact_match("spec.nodeName") == "n1"
    assert selector.requires_exact_match("status.phase") is None
    assert parse_field_selector("").empty() and FieldSelector.everything().empty()
    assert not selector.empty()
    assert field_value(POD, "spec.hostNetwork") == "false"
    assert field_value({"a": 1.0}, "a") == "1"
    assert field_value(None, "a") == ""
    assert escape_field_value("a,b=c\\") == "a\\,b\\=c\\\\"


@given(
    st.lists(
        st.tuples(
            st.from_regex(r"[a-z][a-zA-Z]{0,5}(\.[a-z][a-zA-Z]{0,5}){0,2}", fullmatch=True),
            st.sampled_from(["=", "!="]),
            st.text(max_size=8),
        ),
        max_size=4,
    )
)
def test_field_string_form_roundtrips(terms):
    selector = FieldSelector(FieldRequirement(*t) for t in terms)
    reparsed = parse_field_selector(str(selector))
    assert sorted(reparsed.requirements) == sorted(selector.requirements)


@given(st.text(alphabet=st.sampled_from(list("ab.=!,\\ ")), max_size=16))
def test_field_parser_only_raises_selector_error(text):
    try:
        parse_field_selector(text)
    except SelectorError:
        pass
