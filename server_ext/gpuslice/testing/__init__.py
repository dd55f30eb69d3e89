"""Test doubles that ship with gpuslice so tests in other processes can use them too."""
