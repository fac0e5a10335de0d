"""A production-RL loop in a box (``make loop``, docs/loop.md): a genuine vLLM server behind a logging proxy,
traffic from an OpenAI client, a grader, ``prl run`` as cron calls it, a trainer step on what prl published, and
the new weights loaded into the server in place."""
