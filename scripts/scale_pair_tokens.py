"""Fed tokens of bench --scale's 0.5B pair (1,200 tickets with 20% repeats, and with none): whether
the time saved by the repeats should follow their share of the items. Run from a directory
holding an init-random tiny model as ./tiny (the tokenizer is the same for every preset)."""

import gzip
import json
from pathlib import Path

from mlxbatch.api.classifier import Classifier
from mlxbatch.bench.scale_runs import write_workload

clf = Classifier.load(Path("tiny"))
out = {}
for name, share in (("repeats", 0.2), ("no repeats", 0.0)):
    p = Path(f"pair-{share}.jsonl.gz")
    write_workload(p, 1200, share, 0)
    texts = [json.loads(line)["text"] for line in gzip.open(p, "rt")]
    uniq = list(dict.fromkeys(texts))
    fed = [len(clf.engine.fed(x)) for x in clf.engine.prompts(uniq)]
    out[name] = (len(texts), len(uniq), sum(fed))
    print(
        name,
        len(texts),
        "rows",
        len(uniq),
        "scored",
        sum(fed),
        "fed tokens",
        sum(f * f for f in fed),
        "sum fed^2",
    )
r, u = out["repeats"], out["no repeats"]
print(f"items ratio {u[1] / r[1]:.3f}, fed-token ratio {u[2] / r[2]:.3f}")
