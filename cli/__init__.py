"""User commands that are not DVC stages (``stages/`` holds those): ``regrab-predict``."""
