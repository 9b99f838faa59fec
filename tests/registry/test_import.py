"""reach_import: valid directories import, each kind of invalid descriptor is refused with file and field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command

from registry.choices import VersionState
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
