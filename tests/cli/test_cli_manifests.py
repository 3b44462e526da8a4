import io
import json
import textwrap

from gpufleet.cli import manifests
from gpufleet.cli.manifests import load, parse_text, sort_for_apply, split_documents

DEPLOY = textwrap.dedent("""\
    apiVersion: apps/v1
    kind: Deployment
    metadata:
      name: web
    spec:
      replicas: 2
    """)


def test_multi_document_yaml_numbers_the_documents():
    text = "---\n" + DEPLOY + "---\n# only a comment\n---\napiVersion: v1\nkind: Service\nmetadata: {name: web}\n"
    result = parse_text(text, "app.yaml")
    assert not result.errors
    assert [(m.index, m.kind, m.name) for m in result.manifests] == [(1, "Deployment", "web"), (2, "Service", "web")]
    assert result.manifests[1].where == "app.yaml (document 2)"


def test_syntax_error_names_document_and_file_line_and_later_documents_still_load():
    text = DEPLOY + "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: [oops\n---\n" + DEPLOY
    result = parse_text(text, "deploy.yaml")
    assert [m.index for m in result.manifests] == [1, 3]
    assert len(result.errors) == 1
    problem = result.errors[0]
    assert problem.index == 2
    message = str(problem)
    assert message.startswith("deploy.yaml (document 2): YAML syntax error at line ")
    # the broken flow sequence starts on line 11 of the file; the error is reported at or after it
    line = int(message.split("line ")[1].split(",")[0])
    assert 11 <= line <= 12


def test_missing_api_version_and_kind_are_reported_per_document():
    result = parse_text(DEPLOY + "---\nmetadata: {name: x}\n---\n- a\n- b\n", "x.yaml")
    assert [str(e) for e in result.errors] == [
        "x.yaml (document 2): apiVersion not set, kind not set",
        "x.yaml (document 3): expected an object with apiVersion and kind, got a list",
    ]
    assert len(result.manifests) == 1


def test_kind_list_is_expanded_with_item_positions():
    doc = {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}},
        {"kind": "Service", "metadata": {"name": "b"}},
    ]}
    result = parse_text(json.dumps(doc), "list.json", json_file=True)
    assert [m.name for m in result.manifests] == ["a"]
    assert str(result.errors[0]) == "list.json (document 1, item 2): apiVersion not set"


def test_bad_json_file():
    result = parse_text('{"apiVersion": "v1",', "x.json", json_file=True)
    assert result.errors and result.errors[0].message.startswith("JSON syntax error")


def test_directory_reads_yaml_yml_json_sorted_and_skips_others(tmp_path):
    (tmp_path / "b.yml").write_text(DEPLOY.replace("web", "b"))
    (tmp_path / "a.yaml").write_text(DEPLOY.replace("web", "a"))
    (tmp_path / "c.json").write_text(json.dumps({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "c"}}))
    (tmp_path / "notes.txt").write_text("not a manifest")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "d.yaml").write_text(DEPLOY.replace("web", "d"))
    result = load([str(tmp_path)])
    assert not result.errors
    assert [m.name for m in result.manifests] == ["a", "b", "c"]
    assert result.manifests[0].source == str(tmp_path / "a.yaml")
    recursive = load([str(tmp_path)], recursive=True)
    assert [m.name for m in recursive.manifests] == ["a", "b", "c", "d"]


def test_stdin_and_missing_path():
    result = load(["-", "nope.yaml"], stdin=io.StringIO(DEPLOY))
    assert [(m.source, m.name) for m in result.manifests] == [(manifests.STDIN_NAME, "web")]
    assert str(result.errors[0]) == 'nope.yaml: the path "nope.yaml" does not exist'


def test_split_keeps_line_numbers_and_inline_content_after_marker():
    docs = split_documents("a: 1\n--- {b: 2}\n---\nc: 3\n...\n")
    assert docs[0] == (0, "a: 1")
    assert docs[1] == (1, "{b: 2}")
    assert docs[2] == (3, "c: 3")


def test_apply_order_puts_namespaces_first_and_keeps_file_order_otherwise():
    text = "\n---\n".join([
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d1}",
        "apiVersion: kubeflow.org/v1\nkind: Unknownish\nmetadata: {name: u}",
        "apiVersion: v1\nkind: Service\nmetadata: {name: s}",
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: ns}",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d2}",
    ])
    ordered = sort_for_apply(parse_text(text, "f.yaml").manifests)
    assert [m.name for m in ordered] == ["ns", "s", "d1", "d2", "u"]


def test_non_string_name_is_a_document_error():
    result = parse_text("apiVersion: v1\nkind: Pod\nmetadata:\n  name: 12\n", "p.yaml")
    assert str(result.errors[0]) == "p.yaml (document 1): metadata.name must be a string, got the number 12"
