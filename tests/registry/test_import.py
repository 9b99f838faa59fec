"""reach_import: valid directories import, each kind of invalid descriptor is refused with file and field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from registry.choices import VersionState
from registry.descriptors import ParsedDescriptor, descriptors_import
from registry.models import AuditLog, CapabilityVersion

pytestmark = pytest.mark.django_db
EXAMPLES = Path("examples/descriptors")


def test_valid_directory_imports_and_reimport_is_a_noop():
    call_command("reach_import", str(EXAMPLES), verbosity=0)
    assert CapabilityVersion.objects.count() == 6
    assert set(CapabilityVersion.objects.values_list("state", flat=True)) == {VersionState.DRAFT}
    audits = AuditLog.objects.count()
    call_command("reach_import", str(EXAMPLES), verbosity=0)
    assert CapabilityVersion.objects.count() == 6
    assert AuditLog.objects.count() == audits


def test_activate_makes_versions_active(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        call_command("reach_import", str(EXAMPLES / "order-agent.yaml"), "--activate", verbosity=0)
    assert CapabilityVersion.objects.get().state == VersionState.ACTIVE


def test_new_version_is_a_new_row(tmp_path):
    data = yaml.safe_load((EXAMPLES / "order-agent.yaml").read_text())
    call_command("reach_import", str(EXAMPLES / "order-agent.yaml"), verbosity=0)
    data["capabilities"][0]["version"] = "1.1.0"
    data["capabilities"][0]["examples"].append("what did I order last month")
    path = tmp_path / "order-agent.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    call_command("reach_import", str(path), verbosity=0)
    assert sorted(CapabilityVersion.objects.values_list("version", flat=True)) == ["1.0.0", "1.1.0"]


def test_same_version_with_other_content_is_refused(tmp_path):
    data = yaml.safe_load((EXAMPLES / "order-agent.yaml").read_text())
    call_command("reach_import", str(EXAMPLES / "order-agent.yaml"), verbosity=0)
    data["capabilities"][0]["description"] = "changed"
    path = tmp_path / "order-agent.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    with pytest.raises(CommandError, match="bump the version"):
        call_command("reach_import", str(path), verbosity=0)


def _broken(mutate):
    data = yaml.safe_load((EXAMPLES / "notify-agent.yaml").read_text())
    mutate(data)
    return data


CASES = {
    "few_examples": (lambda d: d["capabilities"][0].update(examples=d["capabilities"][0]["examples"][:5]),
                     "capabilities[0].examples", "at least 10"),
    "no_negatives": (lambda d: d["capabilities"][0].update(negative_cases=[]),
                     "capabilities[0].negative_cases", "at least 1"),
    "bad_schema": (lambda d: d["capabilities"][0].update(input_schema={"type": "no-such-type"}),
                   "capabilities[0].input_schema", "not a valid JSON Schema"),
    "bad_action": (lambda d: d["capabilities"][0].update(action="teleport"),
                   "capabilities[0].action", "preset list"),
    "unknown_env": (lambda d: d["agent"].update(environment="moon"), "agent.environment", "unknown environment"),
    "missing_name": (lambda d: d["capabilities"][0].pop("name"), "capabilities[0].name", "required"),
    "bad_runtime": (lambda d: d["capabilities"][0]["runtime"].update(timeout_ms="soon"),
                    "capabilities[0].runtime.timeout_ms", "non-negative"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_invalid_descriptor_is_refused_with_file_and_field(case, tmp_path, capsys):
    mutate, field, message = CASES[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump(_broken(mutate), allow_unicode=True))
    good = tmp_path / "order-agent.yaml"
    good.write_text((EXAMPLES / "order-agent.yaml").read_text())
    with pytest.raises(CommandError, match="nothing imported"):
        call_command("reach_import", str(tmp_path), verbosity=0)
    err = capsys.readouterr().err
    assert f"{path}: {field}: " in err and message in err
    assert CapabilityVersion.objects.count() == 0  # all or nothing


def test_invalid_yaml_is_reported(tmp_path, capsys):
    path = tmp_path / "broken.yaml"
    path.write_text("agent: [unclosed\n")
    with pytest.raises(CommandError):
        call_command("reach_import", str(path), verbosity=0)
    assert f"{path}: : is not valid YAML" in capsys.readouterr().err


def _synthetic(n: int, start: int = 0) -> list[ParsedDescriptor]:
    """``n`` one-capability agents as parsed descriptors (what reach_import hands to the import)."""
    return [ParsedDescriptor(path=f"<bulk-{i}>", agent={"endpoint_id": f"bulk-agent-{i}", "team": f"team-{i % 3}",
                                                         "environment": "dev"},
                             capabilities=[{"name": f"bulk.cap{i}", "version": "1", "action": "query",
                                            "examples": [f"request {k} for capability {i}" for k in range(10)],
                                            "negative_cases": ["something else"]}])
            for i in range(start, start + n)]


def test_import_writes_in_bulk_so_its_statements_do_not_grow_with_the_capabilities(
        django_assert_max_num_queries, django_capture_on_commit_callbacks):
    # given a small import, counted
    with django_capture_on_commit_callbacks(execute=False) as small_callbacks:
        with CaptureQueriesContext(connection) as small:
            descriptors_import(parsed=_synthetic(3), activate=True)
    # when an import of 60 times as many capabilities runs, then it takes no more statements (batched writes)
    with django_capture_on_commit_callbacks(execute=False) as big_callbacks:
        with django_assert_max_num_queries(len(small.captured_queries)):
            result = descriptors_import(parsed=_synthetic(180, start=3), activate=True)
    assert len(result.created) == len(result.activated) == 180
    assert CapabilityVersion.objects.filter(state=VersionState.ACTIVE).count() == 183
    # every new agent and version has its audit rows, as one at a time would have written them
    assert AuditLog.objects.filter(action="agent.created").count() == 183
    assert AuditLog.objects.filter(action="version.imported").count() == 183
    assert AuditLog.objects.filter(action="version.activated").count() == 183
    # the embedding is enqueued in batches, not one task per version

    def embeddings(callbacks):
        return [c for c in callbacks if c.__qualname__.startswith("_embed_later")]

    assert len(embeddings(small_callbacks)) == 1 and len(embeddings(big_callbacks)) == 1
    # and the import stays idempotent
    again = descriptors_import(parsed=_synthetic(180, start=3))
    assert len(again.unchanged) == 180 and not again.created


def test_a_later_version_in_the_same_import_retires_the_earlier_one(tmp_path, django_capture_on_commit_callbacks):
    data = yaml.safe_load((EXAMPLES / "order-agent.yaml").read_text())
    first = tmp_path / "a.yaml"
    first.write_text(yaml.safe_dump(data, allow_unicode=True))
    data["capabilities"][0]["version"] = "1.1.0"
    data["capabilities"][0]["examples"].append("what did I order last month")
    second = tmp_path / "b.yaml"
    second.write_text(yaml.safe_dump(data, allow_unicode=True))
    with django_capture_on_commit_callbacks(execute=False):
        call_command("reach_import", str(first), str(second), "--activate", verbosity=0)
    states = dict(CapabilityVersion.objects.values_list("version", "state"))
    assert states == {"1.0.0": VersionState.RETIRED, "1.1.0": VersionState.ACTIVE}
    # both were activated, one after the other, as two single activations would have left them
    assert CapabilityVersion.objects.filter(activated_at__isnull=True).count() == 0
    retired = AuditLog.objects.get(action="version.retired")
    assert retired.target_repr == "order.query@1.0.0" and retired.after == {"state": VersionState.RETIRED}
    assert AuditLog.objects.filter(action="version.activated").count() == 2
