import pytest

from punchline.data.errors import RetryableProviderError
from punchline.pipelines.humor.data.judge import (
    JUDGE_MARKER,
    JudgeParseError,
    cohen_kappa,
    judge_request,
    judge_stats,
    parse_score,
)
from tests.fixtures.simulated import ask
from tests.pipelines.humor.data.conftest import make_item


def test_request_contains_task_reference_answer_and_marker() -> None:
    item = make_item(5, "ирония,Б")
    req = judge_request("fake", "judge-70b", item, "ОТВЕТ ирония\nРЕШЕНИЕ Б")
    assert req.temperature == 0.0
    user = req.messages[-1].content
    assert JUDGE_MARKER in user
    assert "основной текст 5" in user and "Эталонный ответ: ирония,Б" in user
    assert "ОТВЕТ ирония\nРЕШЕНИЕ Б" in user and "SCORE: <0 или 1>" in user
    assert req.key() == judge_request("fake", "judge-70b", item, "ОТВЕТ ирония\nРЕШЕНИЕ Б").key()


def test_fake_provider_answers_judge_prompt_with_parseable_score() -> None:
    req = judge_request("fake", "judge-70b", make_item(5, "ирония,Б"), "ОТВЕТ ирония\nРЕШЕНИЕ Б")
    text = ask(req.messages[1].content, system=req.messages[0].content, key=req.key(), model=req.model)
    assert parse_score(text) in (0.0, 1.0)


@pytest.mark.parametrize(
    ("text", "score"),
    [("SCORE: 1", 1.0), ("SCORE: 0", 0.0), ("score:1\n", 1.0), ("Анализ...\n**SCORE:** 1", 1.0), ("SCORE: 0.5", 0.5)],
)
def test_parse_score(text: str, score: float) -> None:
    assert parse_score(text) == score


@pytest.mark.parametrize(
    "text", ["", "1", "SCORE: 2", "SCORE: -1", "SCORE: да", "SCORE: 1\nSCORE: 0", "SCORE: 1 из 1", "Оценка: 1"]
)
def test_parse_score_rejects(text: str) -> None:
    with pytest.raises(JudgeParseError) as err:
        parse_score(text)
    assert isinstance(err.value, RetryableProviderError) and err.value.retryable


def test_kappa_hand_computed() -> None:
    # po = 3/4; pa = 1/2, pb = 3/4 -> pe = 3/8 + 1/8 = 1/2; kappa = (3/4 - 1/2) / (1/2) = 1/2
    assert cohen_kappa([1, 1, 0, 0], [1, 1, 1, 0]) == pytest.approx(0.5)
    assert cohen_kappa([1, 0], [1, 0]) == 1.0
    assert cohen_kappa([1, 1], [1, 1]) is None
    assert cohen_kappa([], []) is None


def test_judge_stats_missing_is_not_zero() -> None:
    em = {1: 1, 2: 1, 3: 0, 4: 0, 5: 1}
    stats = judge_stats({1: 1.0, 2: 1.0, 3: 1.0, 4: 0.0, 5: None}, em)
    assert stats.n_scored == 4 and stats.n_missing == 1
    assert stats.mean_score == pytest.approx(0.75) and stats.pass_rate == pytest.approx(0.75)
    assert stats.agreement_with_em == pytest.approx(0.75)
    assert stats.kappa_with_em == pytest.approx(0.5)
    empty = judge_stats({}, em)
    assert empty.n_missing == 5 and empty.mean_score is None and empty.kappa_with_em is None
