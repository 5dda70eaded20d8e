"""Kafka triggers against a real Apache Kafka broker (KRaft, from Maven Central, started by
scripts/kafka.sh): each message runs the lambda once with OpenLambda's metadata headers;
auto_offset_reset; offsets committed only after the handler succeeds, so a restarted worker
neither loses nor repeats handled messages; a failing message retried, then recorded as
failed, never dropped; consumers stopped when their lambda is deleted or replaced.

The lambdas append what they saw to a file in a writable volume, which the test reads."""

import json
import os
import subprocess
import time
import uuid

import pytest

from conftest import ROOT, Worker, free_port, targz

confluent_kafka = pytest.importorskip("confluent_kafka")
SANDBOX_UID = 65534

RECORDER = """
import json, os


def app(environ, start_response):
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)).decode()
    seen = {{"version": {version}, "body": body,
            "topic": environ.get("HTTP_X_KAFKA_TOPIC"), "partition": environ.get("HTTP_X_KAFKA_PARTITION"),
            "offset": environ.get("HTTP_X_KAFKA_OFFSET"), "group": environ.get("HTTP_X_KAFKA_GROUP_ID"),
            "method": environ["REQUEST_METHOD"], "content_type": environ.get("CONTENT_TYPE")}}
    with open("/data/{log}", "a") as log:
        log.write(json.dumps(seen) + "\\n")
    if "fail" in body:
        start_response("500 Internal Server Error", [("Content-Type", "text/plain")])
        return [b"refused"]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]
"""


def trigger_yaml(port, topic, group, reset="earliest"):
    return (f"triggers:\n  kafka:\n    - bootstrap_servers: [\"127.0.0.1:{port}\"]\n      topics: [{topic}]\n"
            f"      group_id: {group}\n      auto_offset_reset: {reset}\n")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    directory = tmp_path_factory.mktemp("kafka")
    port = free_port()
    subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "up", str(directory), str(port)], check=True, timeout=300)
    yield port
    subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "down", str(directory)], check=True, timeout=120)


@pytest.fixture
def data_dir(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, SANDBOX_UID, SANDBOX_UID)
    return data


def start_worker(tmp_path, data_dir):
    return Worker(tmp_path / "worker", {"sandbox": {"volumes": [{"host": str(data_dir), "path": "/data", "writable": True}]}}).start()


def produce(port, topic, *values):
    producer = confluent_kafka.Producer({"bootstrap.servers": f"127.0.0.1:{port}"})
    for value in values:
        producer.produce(topic, value=value.encode())
    assert producer.flush(30) == 0


def seen(data_dir, log, count, timeout=60):
    """The log's records once it has at least `count` (or fail after `timeout`)."""
    path = data_dir / log
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        if len(records) >= count:
            return records
        time.sleep(0.1)
    raise AssertionError(f"{count} records expected in {log}, saw {records}")


def deploy(w, name, port, topic, group, version=1, reset="earliest", log=None):
    source = RECORDER.format(version=version, log=log or f"{name}.jsonl")
    return w.client.upload(name, targz({"f.py": source, "ol.yaml": trigger_yaml(port, topic, group, reset)}))


def test_each_message_runs_the_lambda_once_with_openlambdas_metadata(broker, tmp_path, data_dir):
    topic, group = f"orders-{uuid.uuid4().hex[:8]}", "orders-lambda"
    w = start_worker(tmp_path, data_dir)
    try:
        deploy(w, "orders", broker, topic, group)
        produce(broker, topic, '{"order": 1}', '{"order": 2}', '{"order": 3}')
        records = seen(data_dir, "orders.jsonl", 3)
        assert [r["body"] for r in records] == ['{"order": 1}', '{"order": 2}', '{"order": 3}']
        assert [r["offset"] for r in records] == ["0", "1", "2"]
        assert all(r["topic"] == topic and r["partition"] == "0" and r["group"] == group for r in records)
        assert all(r["method"] == "POST" and r["content_type"] == "application/json" for r in records)
        time.sleep(1)
        assert len(seen(data_dir, "orders.jsonl", 3)) == 3  # once each
        stats = w.client.stats()["kafka"]["orders"]
        assert stats == {"consuming": True, "received": 3, "succeeded": 3, "retried": 0, "failed": 0}
        # Kafka deliveries take the one invocation path: counted, and logged with a request id.
        metrics = w.client.metrics()
        assert 'sprout_invocations_total{lambda="orders",start="cold",outcome="ok"} 1' in metrics, metrics
        assert 'sprout_invocations_total{lambda="orders",start="warm",outcome="ok"} 2' in metrics, metrics
        starts = [e for e in w.client.logs("orders") if e["type"] == "start"]
        assert len(starts) == 3 and all(e["trigger"] == "kafka" and e["request_id"] for e in starts)
    finally:
        w.stop()
    assert w.leftovers() == []


def test_auto_offset_reset_says_where_a_new_group_starts(broker, tmp_path, data_dir):
    topic = f"history-{uuid.uuid4().hex[:8]}"
    produce(broker, topic, "before-1", "before-2")
    w = start_worker(tmp_path, data_dir)
    try:
        deploy(w, "from-start", broker, topic, "g-earliest", reset="earliest")
        deploy(w, "from-now", broker, topic, "g-latest", reset="latest")
        assert [r["body"] for r in seen(data_dir, "from-start.jsonl", 2)] == ["before-1", "before-2"]
        time.sleep(3)  # the latest consumer has joined its group and found the end
        produce(broker, topic, "after")
        assert [r["body"] for r in seen(data_dir, "from-now.jsonl", 1)] == ["after"]
        assert [r["body"] for r in seen(data_dir, "from-start.jsonl", 3)] == ["before-1", "before-2", "after"]
    finally:
        w.stop()


def test_a_restarted_worker_resumes_after_the_last_handled_message(broker, tmp_path, data_dir):
    topic = f"resume-{uuid.uuid4().hex[:8]}"
    w = start_worker(tmp_path, data_dir)
    try:
        deploy(w, "resume", broker, topic, "g-resume")
        produce(broker, topic, "a", "b", "c")
        seen(data_dir, "resume.jsonl", 3)
        w.stop()
        produce(broker, topic, "d", "e")
        w.start()
        seen(data_dir, "resume.jsonl", 5)
        time.sleep(2)
        assert [r["body"] for r in seen(data_dir, "resume.jsonl", 5)] == ["a", "b", "c", "d", "e"]
    finally:
        w.stop()


def test_a_failing_message_is_retried_then_recorded_as_failed_and_the_rest_go_on(broker, tmp_path, data_dir):
    topic = f"flaky-{uuid.uuid4().hex[:8]}"
    w = start_worker(tmp_path, data_dir)
    try:
        deploy(w, "flaky", broker, topic, "g-flaky")
        produce(broker, topic, "fine-1", "please fail", "fine-2")
        records = seen(data_dir, "flaky.jsonl", 5)
        assert [r["body"] for r in records] == ["fine-1", "please fail", "please fail", "please fail", "fine-2"]
        failed = [json.loads(line) for line in (w.dir / "kafka-failed.jsonl").read_text().splitlines()]
        assert len(failed) == 1
        assert (failed[0]["lambda"], failed[0]["topic"], failed[0]["offset"], failed[0]["value"]) == ("flaky", topic, 1, "please fail")
        assert failed[0]["attempts"] == 3 and "500" in failed[0]["error"]
        stats = w.client.stats()["kafka"]["flaky"]
        assert (stats["received"], stats["succeeded"], stats["retried"], stats["failed"]) == (3, 2, 2, 1)
    finally:
        w.stop()


def test_consumers_stop_when_their_lambda_is_replaced_or_deleted(broker, tmp_path, data_dir):
    topic = f"versions-{uuid.uuid4().hex[:8]}"
    w = start_worker(tmp_path, data_dir)
    try:
        deploy(w, "versions", broker, topic, "g-versions", version=1, log="versions.jsonl")
        produce(broker, topic, "one")
        assert seen(data_dir, "versions.jsonl", 1)[0]["version"] == 1
        deploy(w, "versions", broker, topic, "g-versions", version=2, log="versions.jsonl")
        time.sleep(3)  # the old consumer left the group; the new one joined
        produce(broker, topic, "two")
        records = seen(data_dir, "versions.jsonl", 2)
        assert [(r["version"], r["body"]) for r in records] == [(1, "one"), (2, "two")]
        w.client.delete("versions")
        assert w.client.stats()["kafka"]["versions"]["consuming"] is False
        produce(broker, topic, "three")
        time.sleep(3)
        assert len(seen(data_dir, "versions.jsonl", 2)) == 2
    finally:
        w.stop()
