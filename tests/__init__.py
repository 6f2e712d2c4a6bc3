"""Shared helpers of the test suite."""

import importlib
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def experiment(name: str):
    """The module ``experiments/<name>.py`` (imported with experiments/ on the path, which is
    taken off again: the experiments import each other by plain name)."""
    folder = os.path.join(REPO, "experiments")
    sys.path.insert(0, folder)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(folder)
