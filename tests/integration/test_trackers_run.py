"""The tiny job reporting to TensorBoard and MLflow: both hold what metrics.jsonl holds, step for step."""

from __future__ import annotations

import pytest
from procs import FREE_PORTS, REPO, metrics, streamrl, summary

pytestmark = pytest.mark.slow


def test_the_tiny_run_reports_every_step_to_tensorboard_and_mlflow(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    streamrl("run", str(REPO / "configs" / "tiny.yaml"), "steps=5", "name=tr", f"run_dir={tmp_path / 'runs'}",
             "monitoring.report_to=[tensorboard,mlflow]", "monitoring.learner_port=0", "monitoring.actor_port=0",
             *FREE_PORTS, cwd=tmp_path)
    run = tmp_path / "runs" / "tr"
    recs = metrics(run)
    assert [r["step"] for r in recs] == [0, 1, 2, 3, 4]
    rewards = [r["reward_mean"] for r in recs]
    reported = summary(run)["trackers"]
    assert (reported["report_to"], reported["failures"]) == (["tensorboard", "mlflow"], {"tensorboard": 0, "mlflow": 0})

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("reward_mean")] == [0, 1, 2, 3, 4]
    assert [e.value for e in acc.Scalars("reward_mean")] == pytest.approx(rewards)  # float32 in the event file
    assert acc.Scalars("summary/steps")[-1].value == 5

    # No MLFLOW_TRACKING_URI: the learner used the default, a file store beside the run directories.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{tmp_path / 'runs' / 'mlruns'}")
    [mlrun] = client.search_runs([client.get_experiment_by_name("streamrl").experiment_id])
    history = sorted((m.step, m.value) for m in client.get_metric_history(mlrun.info.run_id, "reward_mean"))
    assert history == list(enumerate(rewards))
    assert mlrun.info.run_name == "tr" and mlrun.info.status == "FINISHED"
    assert mlrun.data.params["steps"] == "5" and mlrun.data.params["task.name"] == "copy"  # the config as params
