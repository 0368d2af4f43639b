"""The Spark ``compact`` pipeline refuses a queue whose older compacted files only the tier
holds (``tierFloor``): it works on the store directory alone, and a round without those files
would drop tombstones whose older values they hold and forget the floor, after which the tier's
files are swept. Nothing is compacted; the store reads back every record, the released ones
from the tier (a real POSIX tier, local Spark)."""

from __future__ import annotations

import json

import pytest
from compaction_util import TOPIC, as_table, read_from, small_config
from conftest_spark import spark_session  # noqa: F401  (the shared `spark` fixture)
from test_compaction_tier import open_tiered, raw_rows
from test_compaction_tier_floor import released_history, state_json
from test_spark_compact import _write_topics

from stratamq.spark.pipelines.common import PipelineError
from stratamq.spark.pipelines.compact import run_compact


def test_a_queue_with_files_in_the_tier_only_is_refused(spark, tmp_path):
    settings, rows, model, _released = released_history(tmp_path)
    root = tmp_path / "store"
    _write_topics(root)
    before = state_json(tmp_path)
    state_file = root / "compaction" / "compactionLog" / TOPIC / "0" / "state.json"
    with pytest.raises(PipelineError, match="tierFloor") as caught:
        run_compact(spark, str(root), TOPIC, config=small_config(root), progress=False)
    assert str(state_file) in str(caught.value)
    assert json.loads(state_file.read_text()) == before
    parts = open_tiered(root, settings)
    assert raw_rows(parts.store) == rows
    assert as_table(read_from(parts.store)) == model
    parts.close()
