"""The teacher's kit (`make assignments`, scripts/make_assignments.py): each autograder fails on the
student's stub and passes on the key, and the student version keeps the exercises but no solution."""
import subprocess
import sys

import pytest

import make_assignments as M  # scripts/, put on sys.path by conftest


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    return M.make(tmp_path_factory.mktemp("assignments"))


def grade(folder, answers: str) -> subprocess.CompletedProcess:
    (folder / "answers.py").write_text(answers)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"], cwd=folder,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("chapter", sorted(M.ASSIGNMENTS))
def test_the_autograder_fails_the_stub_and_passes_the_key(kit, chapter):
    folder = next(f for f in kit if f.name == chapter)
    stub = (folder / "answers.py").read_text()
    failed = grade(folder, stub)
    assert failed.returncode == 1 and "NotImplementedError" in failed.stdout, failed.stdout[-2000:]
    passed = grade(folder, (folder / "solution" / "answers.py").read_text())
    assert passed.returncode == 0, passed.stdout[-2000:]
    (folder / "answers.py").write_text(stub)


def test_the_student_version_keeps_the_exercises_and_drops_the_solutions(kit):
    for folder in kit:
        original = (M.ROOT / "book" / f"{folder.name}.md").read_text()
        student = (folder / f"{folder.name}.md").read_text()
        assert original.count(":::{exercise}") == student.count(":::{exercise}") > 0, folder.name
        assert ":::{solution}" not in student, folder.name
        assert "## Assignment" in student and "answers.py" in student
