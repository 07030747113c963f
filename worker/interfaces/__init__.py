"""Hosts that meet users where they already work, over the producer: an MCP server (tools for
desktop agents, over stdio or the API's `/mcp`), the OpenAI Batch API's files and batches, and a
terminal chat. Each drives `worker.producer` and reads the results store; none runs an agent
itself. The views they share (an answer with its grounding, a corpus hit) live here once.
"""
