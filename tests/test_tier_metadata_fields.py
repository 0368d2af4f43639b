"""A tier metadata document whose segment fields are of the wrong kind stops the load with the
file's name, as a document that does not parse does, instead of failing a later read with a
bare TypeError."""

from __future__ import annotations

import json

import pytest
from test_tier_store import fill, open_tiered, tier_config

from stratamq.tiered.metadata import MetadataCorrupt, MetadataStore
from stratamq.tiered.naming import METADATA_FILE


@pytest.mark.parametrize("field,bad", [("parts", "0,100"), ("parts", [100, 0]),
                                       ("parts", [0, "x"]), ("size", "12")])
def test_a_segment_field_of_the_wrong_kind_is_refused_naming_the_file(tmp_path, field, bad):
    config = tier_config(tmp_path)
    store, tier = open_tiered(config)
    try:
        fill(store, 20)
        assert tier.flush(60)
    finally:
        store.close()
        tier.close()
    root = config.root
    MetadataStore(root)  # the document as written loads
    path = root / METADATA_FILE
    doc = json.loads(path.read_text())
    table = next(t for name, t in doc.items() if name.endswith("SegmentTable") and t)
    entry = next(iter(next(iter(table.values())).values()))
    entry[field] = bad
    path.write_text(json.dumps(doc))
    with pytest.raises(MetadataCorrupt, match="tieredStoreMetadata.json is damaged") as raised:
        MetadataStore(root)
    assert field in str(raised.value)
