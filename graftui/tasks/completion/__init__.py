"""Completion: (prompt, completion) pairs and chats, judged by greedy generation, exact match and loss per token."""
