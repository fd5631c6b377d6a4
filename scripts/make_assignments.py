"""Student versions of the Foundations chapters, with autograder tests (``make assignments``).

    python scripts/make_assignments.py [--out _build/assignments]

For each chapter below, ``OUT/<name>/`` holds:

* ``<name>.md``: the chapter with its exercise solutions removed, and the listing of the function the
  student writes replaced by a pointer to ``answers.py`` (the chapter still runs: its cells call the
  package's reference implementation);
* ``answers.py``: the function to write, with the package's signature and docstring (shape table
  included), raising ``NotImplementedError``;
* ``test_<name>.py``: the autograder (plain pytest, offline): the student's function against the
  package's on seeded random inputs, values and, for losses, gradients;
* ``solution/answers.py``: the key for the teacher (the package's reference, imported).

Grade with ``cd OUT/<name> && python -m pytest -q``. ``tests/test_assignments.py`` checks that each
autograder fails on the stub and passes on the key.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import re
import shutil
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# chapter -> (module, function, the case generator in the autograder, what the student writes)
ASSIGNMENTS = {
    "lab": ("rlcourse.lm.model", "position_ids_from_mask", "position_cases",
            "position ids for a left-padded batch"),
    "policy_gradients": ("rlcourse.advantages", "compute_rloo_outcome_advantage", "outcome_cases",
                         "the leave-one-out (RLOO) advantage"),
    "advantages": ("rlcourse.advantages", "compute_grpo_outcome_advantage", "outcome_cases",
                   "the group-relative (GRPO) advantage"),
    "ppo": ("rlcourse.losses", "compute_policy_loss", "policy_loss_cases", "PPO's clipped surrogate loss"),
    "kl_control": ("rlcourse.losses", "kl_penalty", "kl_cases", "the per-token KL estimators k1, k2, k3"),
    "reward_models": ("rlcourse.losses", "bradley_terry_loss", "bt_cases", "the Bradley-Terry loss"),
    "test_time_scaling": ("rlcourse.testtime", "pass_at_k", "pass_cases", "the unbiased pass@k estimator"),
}

SOLUTION = re.compile(r"^:::\{solution\}.*?^:::\s*$\n?", re.MULTILINE | re.DOTALL)

# the autograder's shared part: seeded input generators and the comparison (one copy per assignment,
# so each folder stands alone)
GRADER = '''"""Autograder for `answers.{fn}` ({what}): your function against the reference in
`{module}` on seeded random inputs (values{grads}). Run: python -m pytest -q"""
import math

import pytest
import torch

import answers
from {module} import {fn} as reference


def outcome_cases():
    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        groups, size, T = 3, 4, 5
        B = groups * size
        lengths = torch.randint(1, T + 1, (B,), generator=g)
        mask = (torch.arange(T)[None] < lengths[:, None]).float()
        scores = torch.randint(0, 2, (B,), generator=g).float() if seed % 2 else torch.rand(B, generator=g)
        rewards = torch.zeros(B, T)
        rewards[torch.arange(B), lengths - 1] = scores
        index = [i // size for i in range(B)]
        yield dict(token_level_rewards=rewards, response_mask=mask, index=index)


def policy_loss_cases():
    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        B, T = 6, 7
        old = -torch.rand(B, T, generator=g) * 3
        new = (old + 0.4 * torch.randn(B, T, generator=g)).requires_grad_(True)
        adv = torch.randn(B, 1, generator=g).expand(B, T).clone()
        mask = (torch.rand(B, T, generator=g) > 0.2).float()
        mask[:, 0] = 1
        yield dict(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask,
                   clip_ratio_low=0.2, clip_ratio_high=0.28 if seed % 2 else 0.2)


def kl_cases():
    for seed in range(3):
        for kind in ("k1", "k2", "k3"):
            g = torch.Generator().manual_seed(seed)
            logp = (-torch.rand(4, 6, generator=g) * 3).requires_grad_(True)
            ref = logp.detach() + 0.5 * torch.randn(4, 6, generator=g)
            yield dict(logprob=logp, ref_logprob=ref, kind=kind)


def bt_cases():
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        chosen = torch.randn(8, generator=g).requires_grad_(True)
        rejected = torch.randn(8, generator=g).requires_grad_(True)
        yield dict(r_chosen=chosen, r_rejected=rejected, margin=torch.rand(8, generator=g) if seed % 2 else None)


def pass_cases():
    for n in (1, 5, 16, 100):
        for c in sorted({{0, 1, n // 2, n}}):
            for k in sorted(k for k in {{1, 2, n // 3, n}} if 1 <= k <= n):
                yield dict(n=n, c=c, k=k)


def position_cases():
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        B, T = 5, 9
        pads = torch.randint(0, T, (B,), generator=g)
        yield dict(attention_mask=(torch.arange(T)[None] >= pads[:, None]).long())


def fresh(case):
    """A copy of a case whose leaf tensors get their own gradients."""
    out = {{}}
    for key, v in case.items():
        out[key] = v.detach().clone().requires_grad_(v.requires_grad) if torch.is_tensor(v) else v
    return out


def leaves(case):
    return [v for v in case.values() if torch.is_tensor(v) and v.requires_grad]


def first(out):
    return out[0] if isinstance(out, tuple) else out


def comparable(out):
    """The whole output when it is tensors (an advantage and its returns), else its first element (a
    loss; the diagnostics dict beside it is not graded)."""
    if isinstance(out, tuple) and all(torch.is_tensor(x) for x in out):
        return out
    return first(out)


CASES = list({cases}())


@pytest.mark.parametrize("case", range(len(CASES)))
def test_matches_the_reference(case):
    mine_in, ref_in = fresh(CASES[case]), fresh(CASES[case])
    mine, ref = answers.{fn}(**mine_in), reference(**ref_in)
    if isinstance(ref, (int, float)):
        assert math.isclose(float(mine), ref, rel_tol=1e-9, abs_tol=1e-12), (mine, ref)
        return
    torch.testing.assert_close(comparable(mine), comparable(ref), rtol=1e-5, atol=1e-6)
    value = first(ref)
    if leaves(ref_in) and torch.is_tensor(value) and value.requires_grad:
        first(mine).sum().backward()
        value.sum().backward()
        for a, b in zip(leaves(mine_in), leaves(ref_in)):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
'''


def stub(module: str, fn: str) -> str:
    """``answers.py``: the reference's signature and docstring, and a NotImplementedError."""
    obj = getattr(importlib.import_module(module), fn)
    source = inspect.getsource(obj)
    source = source[source.index(f"def {fn}("):]  # without the registry's decorator
    header = source[:source.index(":\n", source.index(")")) + 2]  # "def name(...) -> ...:\n"
    doc = textwrap.indent('"""' + (inspect.getdoc(obj) or "") + '\n"""', "    ")
    return (f'"""Your answer: write `{fn}` (the chapter derives it). The autograder compares it with\n'
            f'`{module}.{fn}`."""\nfrom __future__ import annotations\n\nimport math\n\nimport torch\n\n\n'
            f"{header}{doc}\n    raise NotImplementedError(\"write {fn}\")\n")


def student_chapter(text: str, fn: str, what: str) -> str:
    """The chapter without its exercise solutions, with the listing of ``fn`` replaced by a pointer."""
    text = SOLUTION.sub("", text)
    listing = re.compile(r"^```\{literalinclude\}[^\n]*\n(?::[^\n]*\n)*?:pyobject: " + re.escape(fn)
                         + r"\n(?::[^\n]*\n)*```\n", re.MULTILINE)
    text = listing.sub(f"*Assignment: you write `{fn}` ({what}) in `answers.py`; "
                       f"`python -m pytest -q` grades it.*\n", text)
    return text + (f"\n## Assignment\n\nWrite `{fn}` ({what}) in `answers.py`, from the derivation above; "
                   f"its docstring gives the shapes. Then run `python -m pytest -q` in this folder: the "
                   f"autograder compares your function with the book's on seeded random inputs. Answer "
                   f"the exercises in this notebook.\n")


def make(out: Path) -> list[Path]:
    if out.exists():
        shutil.rmtree(out)
    folders = []
    for chapter, (module, fn, cases, what) in ASSIGNMENTS.items():
        folder = out / chapter
        (folder / "solution").mkdir(parents=True)
        text = (ROOT / "book" / f"{chapter}.md").read_text()
        (folder / f"{chapter}.md").write_text(student_chapter(text, fn, what))
        (folder / "answers.py").write_text(stub(module, fn))
        (folder / "solution" / "answers.py").write_text(
            f'"""The key: the book\'s reference implementation (see {module.replace(".", "/")}.py)."""\n'
            f"from {module} import {fn}  # noqa: F401\n")
        grads = ", and gradients" if module == "rlcourse.losses" else ""
        (folder / "pytest.ini").write_text("[pytest]\n")  # this folder is the root: not the book's own tests
        (folder / f"test_{chapter}.py").write_text(GRADER.format(fn=fn, what=what, module=module, grads=grads,
                                                                 cases=cases))
        folders.append(folder)
    return folders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "assignments")
    args = parser.parse_args()
    for folder in make(args.out):
        print(folder)


if __name__ == "__main__":
    main()
