"""The capability review workflow and caller feedback, through the API."""

from __future__ import annotations

import pytest

from registry.choices import VersionState
from registry.models import AuditLog, CapabilityVersion
from tests.reviews.conftest import as_user

pytestmark = pytest.mark.django_db


def order_version() -> CapabilityVersion:
    return CapabilityVersion.objects.get(capability__name="order.query")


def test_submit_approve_activates_with_audit(people, django_capture_on_commit_callbacks):
    version = order_version()
    r = as_user(people["member"]).post(f"/api/v1/capability-versions/{version.pk}/submit")
    assert r.status_code == 200 and r.json()["state"] == "submitted"
    with django_capture_on_commit_callbacks(execute=False):
        r = as_user(people["reviewer"]).post(f"/api/v1/capability-versions/{version.pk}/approve",
                                             {"confidence_weight": 0.8}, format="json")
    assert r.status_code == 200 and r.json()["state"] == "active" and r.json()["confidence_weight"] == 0.8
    actions = list(AuditLog.objects.filter(target_id=str(version.pk), target_type="registry.capabilityversion")
                   .order_by("id").values_list("action", "actor__username"))
    assert actions[-3:] == [("version.submitted", "member"), ("version.approved", "reviewer"),
                            ("version.activated", "reviewer")]


def test_refusals(people):
    version = order_version()
    # another team's member cannot submit
    r = as_user(people["outsider"]).post(f"/api/v1/capability-versions/{version.pk}/submit")
    assert r.status_code == 403 and r.json()["error"]["code"] == "not_your_team"
    # an incomplete descriptor cannot be submitted, with the reasons
    CapabilityVersion.objects.filter(pk=version.pk).update(examples=["one", "two"], negative_cases=[])
    r = as_user(people["member"]).post(f"/api/v1/capability-versions/{version.pk}/submit")
    assert r.status_code == 400 and len(r.json()["error"]["details"]) == 2
    CapabilityVersion.objects.filter(pk=version.pk).update(examples=[f"e{i}" for i in range(10)],
                                                           negative_cases=["n"])
    assert as_user(people["member"]).post(f"/api/v1/capability-versions/{version.pk}/submit").status_code == 200
    # a reviewer of the same team cannot approve; a non-reviewer cannot either
    r = as_user(people["own_reviewer"]).post(f"/api/v1/capability-versions/{version.pk}/approve",
                                             {"confidence_weight": 1}, format="json")
    assert r.status_code == 403 and r.json()["error"]["code"] == "own_team"
    r = as_user(people["member"]).post(f"/api/v1/capability-versions/{version.pk}/approve",
                                       {"confidence_weight": 1}, format="json")
    assert r.status_code == 403
    # rejection needs a comment
    r = as_user(people["reviewer"]).post(f"/api/v1/capability-versions/{version.pk}/reject", {"comment": ""},
                                         format="json")
    assert r.status_code == 400
    r = as_user(people["reviewer"]).post(f"/api/v1/capability-versions/{version.pk}/reject",
                                         {"comment": "examples are placeholders"}, format="json")
    assert r.status_code == 200 and r.json()["state"] == VersionState.REJECTED
    # and a rejected version cannot be approved
    r = as_user(people["reviewer"]).post(f"/api/v1/capability-versions/{version.pk}/approve",
                                         {"confidence_weight": 1}, format="json")
    assert r.status_code == 409


def test_caller_feedback_is_a_labelled_example(api, user):
    from reviews.models import RoutingFeedback
    from routing.models import Task

    Task.objects.create(request_id="fb-1", caller=user, task_text="where is my parcel",
                        capability_label="order.query@1.0.0", status="succeeded")
    r = api.post("/api/v1/tasks/fb-1/feedback", {"correct": False, "comment": "it was a billing question"},
                 format="json")
    assert r.status_code == 201
    feedback = RoutingFeedback.objects.get()
    assert (feedback.request_text, feedback.capability, feedback.correct) == ("where is my parcel", "order.query",
                                                                              False)
    assert api.post("/api/v1/tasks/nope/feedback", {"correct": True}, format="json").status_code == 404


@pytest.mark.parametrize("conditions, where", [
    ([{"type": 12}], "reject_conditions[0]"),
    (["not a schema"], "reject_conditions[0]"),
    ([{"type": "object"}, {"$ref": "https://evil.example/schema.json"}], "reject_conditions[1]"),
])
def test_bad_reject_conditions_do_not_pass_submission(people, conditions, where):
    """Such a condition made every text invoke that considered the version fail with a 500 (issue 12, item 9)."""
    version = order_version()
    CapabilityVersion.objects.filter(pk=version.pk).update(reject_conditions=conditions)
    r = as_user(people["member"]).post(f"/api/v1/capability-versions/{version.pk}/submit")
    assert r.status_code == 400 and r.json()["error"]["code"] == "incomplete_descriptor"
    assert any(d.startswith(where) for d in r.json()["error"]["details"])
    assert order_version().state == VersionState.DRAFT


def test_remote_references_do_not_pass_import(tmp_path, capsys):
    import yaml
    from django.core.management import CommandError, call_command

    source = tmp_path / "bad.yaml"
    data = yaml.safe_load(open("examples/descriptors/order-agent.yaml").read())
    data["capabilities"][0]["reject_conditions"] = [{"$ref": "http://169.254.169.254/schema.json"}]
    source.write_text(yaml.safe_dump(data))
    with pytest.raises(CommandError, match="nothing imported"):
        call_command("reach_import", str(source), verbosity=0)
    assert "reject_conditions[0]: refers outside itself" in capsys.readouterr().err
    assert not CapabilityVersion.objects.exists()


def test_four_eyes_always(people, django_user_model):
    """An admin with no team cannot submit and approve alone; a reviewer decides nothing of their own team's
    (issue 12, item 10)."""
    from tests.reviews.conftest import person

    boss = as_user(person(django_user_model, "boss", group="admin"))
    version = order_version()
    assert boss.post(f"/api/v1/capability-versions/{version.pk}/submit").status_code == 200
    r = boss.post(f"/api/v1/capability-versions/{version.pk}/approve", {"confidence_weight": 1}, format="json")
    assert r.status_code == 403 and r.json()["error"]["code"] == "own_submission"
    r = boss.post(f"/api/v1/capability-versions/{version.pk}/reject", {"comment": "mine"}, format="json")
    assert r.status_code == 403 and r.json()["error"]["code"] == "own_submission"
    r = as_user(people["own_reviewer"]).post(f"/api/v1/capability-versions/{version.pk}/reject",
                                             {"comment": "ours"}, format="json")
    assert r.status_code == 403 and r.json()["error"]["code"] == "own_team"
    assert order_version().state == VersionState.SUBMITTED
    # an active canary: its own team's reviewer neither promotes nor rolls it back
    CapabilityVersion.objects.filter(pk=version.pk).update(state=VersionState.ACTIVE, is_canary=True,
                                                           canary_share=0.1)
    own = as_user(people["own_reviewer"])
    assert own.post(f"/api/v1/capability-versions/{version.pk}/promote").json()["error"]["code"] == "own_team"
    r = own.post(f"/api/v1/capability-versions/{version.pk}/rollback", {"reason": "x"}, format="json")
    assert r.status_code == 403 and r.json()["error"]["code"] == "own_team"
    assert order_version().is_canary and order_version().state == VersionState.ACTIVE
    r = as_user(people["reviewer"]).post(f"/api/v1/capability-versions/{version.pk}/promote")
    assert r.status_code == 200 and not order_version().is_canary
