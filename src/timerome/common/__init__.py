"""Foundations every stage uses: checked numbers and files, caches, locks, progress, threads, cost."""
