"""A program that is no MCP server: it writes lines that are not JSON-RPC, then waits."""

import sys
import time

print("hello, I am not JSON-RPC", flush=True)
sys.stdin.readline()
time.sleep(60)
