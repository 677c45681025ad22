"""Tests for the built-in arithmetic task, record loading, prompt building and PromptLoader."""

from __future__ import annotations

import hashlib
import json

import pytest

from areal_m2po.dataset import (
    N_TEST_PAIRS,
    PromptLoader,
    build_prompts,
    load_records,
    make_arithmetic_split,
)
from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer


def _write_jsonl(path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


# ------------------------------------------------------------------ built-in task
def test_arithmetic_splits_disjoint_and_complete() -> None:
    test = make_arithmetic_split("test", n=N_TEST_PAIRS)
    train = make_arithmetic_split("train")
    assert len(test) == 512 and len(train) == 8100 - 512
    test_q = {r["question"] for r in test}
    train_q = {r["question"] for r in train}
    assert not test_q & train_q
    assert len(test_q | train_q) == 8100
    for record in test[:20] + train[:20]:
        a, b = (
            int(tok) for tok in record["question"][len("What is ") :].split("?")[0].split(" + ")
        )
        assert 10 <= a <= 99 and 10 <= b <= 99
        assert record["answer"] == str(a + b)
        assert record["question"] == f"What is {a} + {b}? Reply with only the number."


def test_arithmetic_deterministic() -> None:
    default_test = make_arithmetic_split("test")
    assert len(default_test) == 128
    assert default_test == make_arithmetic_split("test", seed=123)  # seed never moves the test set
    assert default_test == make_arithmetic_split("test", n=N_TEST_PAIRS)[:128]
    # Pinned: every run, on every machine, evaluates on the same problems.
    digest = hashlib.sha256(json.dumps(default_test).encode()).hexdigest()
    assert digest == PINNED_TEST_DIGEST
    assert make_arithmetic_split("train", n=50, seed=1) == make_arithmetic_split(
        "train", n=50, seed=1
    )
    assert make_arithmetic_split("train", n=50, seed=1) != make_arithmetic_split(
        "train", n=50, seed=2
    )
    whole_1 = make_arithmetic_split("train", seed=1)
    whole_2 = make_arithmetic_split("train", seed=2)
    assert sorted(r["question"] for r in whole_1) == sorted(r["question"] for r in whole_2)


def test_arithmetic_bad_arguments() -> None:
    with pytest.raises(ValueError, match="splits 'train' and 'test'"):
        make_arithmetic_split("validation")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="512"):
        make_arithmetic_split("test", n=513)


PINNED_TEST_DIGEST = "71dfbdba757c05f060134c0937a512d86725ed4411d1aa604305b927a42b3588"


# ------------------------------------------------------------------ load_records
def test_load_builtin() -> None:
    records = load_records("builtin:arithmetic", split="test", max_samples=16)
    assert records == make_arithmetic_split("test", n=16)
    with pytest.raises(ValueError, match="unknown built-in"):
        load_records("builtin:nope")


def test_load_jsonl_renames_and_keeps_fields(tmp_path) -> None:
    path = _write_jsonl(
        tmp_path / "data.jsonl",
        [
            json.dumps({"problem": "1+1?", "solution": "so\n#### 2", "id": 7}),
            "",
            json.dumps({"problem": "2+2?", "solution": 4, "id": 8}),
        ],
    )
    records = load_records(path, prompt_field="problem", answer_field="solution")
    assert records == [
        {"question": "1+1?", "answer": "so\n#### 2", "id": 7},
        {"question": "2+2?", "answer": "4", "id": 8},
    ]
    assert (
        load_records(path, prompt_field="problem", answer_field="solution", max_samples=1)
        == (records[:1])
    )


def test_load_jsonl_malformed_line_reports_location(tmp_path) -> None:
    lines = [json.dumps({"question": f"q{i}", "answer": str(i)}) for i in range(6)]
    lines.append('{"question": "q6", "answer": ')
    path = _write_jsonl(tmp_path / "data.jsonl", lines)
    with pytest.raises(ValueError, match=r"data\.jsonl:7: invalid JSON \(") as info:
        load_records(path)
    assert "\n" not in str(info.value)


def test_a_latin1_byte_names_the_file_and_line(tmp_path) -> None:
    """Issue 57: it was "'utf-8' codec can't decode byte 0xe9 in position 17", no file."""
    path = tmp_path / "data.jsonl"
    good = json.dumps({"question": "q", "answer": "1"}).encode()
    path.write_bytes(good + b"\n" + good + b'\n{"question": "caf\xe9", "answer": "2"}\n')
    with pytest.raises(ValueError) as info:
        load_records(str(path))
    assert str(info.value) == (
        f"{path}:3: not UTF-8 text (byte 0xe9, as Latin-1 or Windows-1252 files have): "
        "save the file as UTF-8"
    )


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("data.jsonl", '{"question": "q0", "answer": "0"}\n{"question": "q1", "answer": "1"}\n'),
        ("data.json", '[{"question": "q0", "answer": "0"}, {"question": "q1", "answer": "1"}]'),
        ("data.csv", "question,answer\nq0,0\nq1,1\n"),
    ],
)
def test_a_byte_order_mark_is_read_past(tmp_path, name, text) -> None:
    """Issue 57: a UTF-8 BOM (Windows editors write one) made line 1 invalid JSON, and a CSV's
    first column 'question' unknown."""
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    records = load_records(str(path))
    assert [(r["question"], r["answer"]) for r in records] == [("q0", "0"), ("q1", "1")]


def test_load_jsonl_missing_field(tmp_path) -> None:
    lines = [json.dumps({"question": "q", "answer": "1"})] * 6 + [json.dumps({"answer": "2"})]
    path = _write_jsonl(tmp_path / "data.jsonl", lines)
    with pytest.raises(ValueError, match=r"data\.jsonl:7: missing field 'question'"):
        load_records(path)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('["q", "1"]', r"data\.jsonl:2: expected a JSON object, got list"),
        (
            '{"question": 3, "answer": "1"}',
            r"data\.jsonl:2: field 'question' must be a string, got int",
        ),
        # both fields are checked for presence before the prompt's type
        ('{"question": 3}', r"data\.jsonl:2: missing field 'answer'$"),
        # an answer no reward function could score (it became the string 'None', ...)
        (
            '{"question": "q", "answer": null}',
            r"data\.jsonl:2: field 'answer' must be a string or a finite number, got null$",
        ),
        (
            '{"question": "q", "answer": true}',
            r"data\.jsonl:2: field 'answer' must be a string or a finite number, got bool True$",
        ),
        (
            '{"question": "q", "answer": ["1", "2"]}',
            r"data\.jsonl:2: field 'answer' must be a string or a finite number, got list",
        ),
        (
            '{"question": "q", "answer": {"v": 1}}',
            r"data\.jsonl:2: field 'answer' must be a string or a finite number, got dict",
        ),
        (
            '{"question": "q", "answer": NaN}',
            r"data\.jsonl:2: field 'answer' must be a string or a finite number, got float nan",
        ),
    ],
)
def test_load_jsonl_bad_record(tmp_path, line: str, message: str) -> None:
    path = _write_jsonl(tmp_path / "data.jsonl", [json.dumps({"question": "q", "answer": 1}), line])
    with pytest.raises(ValueError, match=message):
        load_records(path)


def test_load_json_list(tmp_path) -> None:
    path = tmp_path / "data.json"
    path.write_text(json.dumps([{"question": "a", "answer": "1"}, {"question": "b", "answer": 2}]))
    assert load_records(str(path)) == [
        {"question": "a", "answer": "1"},
        {"question": "b", "answer": "2"},
    ]
    path.write_text(json.dumps({"question": "a"}))
    with pytest.raises(ValueError, match="expected a JSON list"):
        load_records(str(path))


def test_parquet_round_trip(tmp_path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [{"question": f"q{i}", "answer": f"#### {i}", "level": i % 3} for i in range(10)]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert load_records(str(path)) == rows
    assert load_records(str(path), max_samples=3) == rows[:3]


def test_local_directory_through_datasets(tmp_path) -> None:
    pytest.importorskip("datasets")
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    _write_jsonl(
        folder / "train.jsonl", [json.dumps({"q": f"q{i}", "a": str(i)}) for i in range(4)]
    )
    records = load_records(str(folder), split="train", prompt_field="q", answer_field="a")
    assert [r["question"] for r in records] == ["q0", "q1", "q2", "q3"]
    assert [r["answer"] for r in records] == ["0", "1", "2", "3"]


def test_unavailable_hub_dataset_is_one_clear_line(tmp_path, monkeypatch) -> None:
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    with pytest.raises(ValueError, match="could not be loaded offline") as info:
        load_records("nobody-xyz/definitely-not-a-dataset", split="train")
    message = str(info.value)
    assert "\n" not in message
    assert ".jsonl" in message
    with pytest.raises(ValueError, match="does not exist"):
        load_records(str(tmp_path / "missing.jsonl"))


# ------------------------------------------------------------------ build_prompts
def test_build_prompts_chat_template_and_filtering() -> None:
    tok = build_tiny_tokenizer()
    records = [{"question": "What is 10 + 20? Reply with only the number.", "answer": "30"}]
    records.append({"question": "x" * 200, "answer": "0"})
    records.append({"question": "y" * 300, "answer": "0"})
    kept, dropped = build_prompts(records, tok, max_prompt_length=100)
    assert dropped == 2
    assert len(kept) == 1
    prompt = kept[0]
    expected_text = (
        "<|im_start|>user\nWhat is 10 + 20? Reply with only the number.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert prompt["prompt_text"] == expected_text
    assert prompt["prompt_ids"] == tok(expected_text)["input_ids"]
    assert all(isinstance(i, int) for i in prompt["prompt_ids"])
    assert prompt["answer"] == "30"
    assert "prompt_ids" not in records[0]  # inputs are not mutated


def test_build_prompts_system_and_plain() -> None:
    tok = build_tiny_tokenizer()
    records = [{"question": "hi", "answer": "1"}]
    kept, _ = build_prompts(records, tok, 64, system_prompt="Be brief.")
    assert kept[0]["prompt_text"].startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    kept, dropped = build_prompts(records, tok, 64, use_chat_template=False)
    assert (kept[0]["prompt_text"], dropped) == ("hi", 0)
    assert kept[0]["prompt_ids"] == tok("hi")["input_ids"]
    tok.chat_template = None
    kept, _ = build_prompts(records, tok, 64)
    assert kept[0]["prompt_text"] == "hi"
    kept, dropped = build_prompts(records, tok, 1)
    assert (kept, dropped) == ([], 1)


# ------------------------------------------------------------------ PromptLoader
def _records(n: int) -> list[dict]:
    return [{"question": f"q{i}", "answer": str(i)} for i in range(n)]


def _ids(batch: list[dict]) -> list[str]:
    return [r["question"] for r in batch]


def test_loader_epochs_and_determinism() -> None:
    loader = PromptLoader(_records(10), batch_size=3, shuffle=True, seed=5)
    assert loader.steps_per_epoch == 3
    epochs = [loader.next_batch() for _ in range(7)]
    assert [e for _, e in epochs] == [0, 0, 0, 1, 1, 1, 2]
    first_epoch = [q for b, _ in epochs[:3] for q in _ids(b)]
    assert len(set(first_epoch)) == 9  # no repeats inside an epoch; one record left over
    assert _ids(epochs[0][0]) + _ids(epochs[1][0]) != _ids(epochs[3][0]) + _ids(epochs[4][0])
    again = PromptLoader(_records(10), batch_size=3, shuffle=True, seed=5)
    assert [(_ids(b), e) for b, e in (again.next_batch() for _ in range(7))] == [
        (_ids(b), e) for b, e in epochs
    ]


def test_loader_no_shuffle_and_keep_last() -> None:
    loader = PromptLoader(_records(5), batch_size=2, shuffle=False, seed=0, drop_last=False)
    assert loader.steps_per_epoch == 3
    batches = [loader.next_batch() for _ in range(4)]
    assert [_ids(b) for b, _ in batches] == [["q0", "q1"], ["q2", "q3"], ["q4"], ["q0", "q1"]]
    assert batches[3][1] == 1


@pytest.mark.parametrize("taken", [2, 3, 4, 8])  # mid-epoch, at the boundary, across epochs
def test_loader_resume(taken: int) -> None:
    reference = PromptLoader(_records(11), batch_size=4, shuffle=True, seed=9)
    for _ in range(taken):
        reference.next_batch()
    state = json.loads(json.dumps(reference.state_dict()))  # survives serialisation
    expected = [(_ids(b), e) for b, e in (reference.next_batch() for _ in range(5))]
    resumed = PromptLoader(_records(11), batch_size=4, shuffle=True, seed=9)
    resumed.load_state_dict(state)
    assert [(_ids(b), e) for b, e in (resumed.next_batch() for _ in range(5))] == expected


def test_loader_iter_and_errors() -> None:
    loader = PromptLoader(_records(4), batch_size=2, shuffle=False, seed=0)
    iterator = iter(loader)
    assert [_ids(next(iterator)) for _ in range(3)] == [["q0", "q1"], ["q2", "q3"], ["q0", "q1"]]
    with pytest.raises(ValueError, match=r"batch_size=8 .*\(4 records\)"):
        PromptLoader(_records(4), batch_size=8, shuffle=True, seed=0)
    with pytest.raises(ValueError, match="at least one record"):
        PromptLoader([], batch_size=1, shuffle=False, seed=0)
    other = PromptLoader(_records(5), batch_size=2, shuffle=False, seed=0)
    with pytest.raises(ValueError, match="num_records"):
        other.load_state_dict(loader.state_dict())


# ---------------------------------------------------------------- CSV, save_to_disk, local paths


def test_a_local_csv_file_loads_with_its_lines_named(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text('question,answer\n"What is 1 + 2?",3\n"Say ""hi""",hi\n', encoding="utf-8")
    records = load_records(str(path))
    assert [(r["question"], r["answer"]) for r in records] == [
        ("What is 1 + 2?", "3"),
        ('Say "hi"', "hi"),
    ]
    (tmp_path / "bad.csv").write_text("prompt,answer\nx,1\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.csv:2: .*question"):
        load_records(str(tmp_path / "bad.csv"))


def test_a_save_to_disk_folder_loads_without_the_hub(tmp_path, monkeypatch):
    import datasets

    rows = {"question": ["a?", "b?"], "answer": ["1", "2"]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict(rows), "test": datasets.Dataset.from_dict(rows)}
    ).save_to_disk(str(tmp_path / "many"))

    def no_hub(*args, **kwargs):
        raise AssertionError("sent to datasets.load_dataset")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    assert [r["question"] for r in load_records(str(tmp_path / "one"))] == ["a?", "b?"]
    assert [r["answer"] for r in load_records(str(tmp_path / "many"), split="test")] == ["1", "2"]
    with pytest.raises(ValueError, match=r"has no split 'valid'; it has \['test', 'train'\]"):
        load_records(str(tmp_path / "many"), split="valid")


@pytest.mark.parametrize("relative", ["./nope", "sub/nope", "~/no_such_dataset_dir_xyz"])
def test_a_missing_path_that_looks_local_is_never_sent_to_the_hub(tmp_path, monkeypatch, relative):
    import datasets

    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)

    def no_hub(*args, **kwargs):
        raise AssertionError("sent to datasets.load_dataset")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    with pytest.raises(ValueError, match="does not exist"):
        load_records(relative)


def test_tilde_expands_in_a_dataset_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "d.jsonl").write_text('{"question": "q", "answer": "a"}\n', encoding="utf-8")
    assert load_records("~/d.jsonl")[0]["question"] == "q"


def test_a_batch_larger_than_the_data_names_train_dataset_batch_size() -> None:
    """Issue 57: the line said "batch_size=8 is larger than the dataset", not which key."""
    from areal_m2po.api.cli_args import ConfigError, DatasetConfig, PPOConfig
    from areal_m2po.trainer.step_loop import epoch_loader

    cfg = PPOConfig(train_dataset=DatasetConfig(path="d.jsonl", batch_size=8))
    with pytest.raises(ConfigError) as info:
        epoch_loader([{"question": str(i)} for i in range(6)], cfg)
    assert str(info.value) == (
        "train_dataset.batch_size: 8 is more than the 6 records of train_dataset.path=d.jsonl, "
        "so no whole batch can be drawn; lower train_dataset.batch_size or add data"
    )
