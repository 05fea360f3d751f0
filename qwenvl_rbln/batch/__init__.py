"""qvl infer --batch-file at scale: the streamed input, the results file and resume, one worker per NPU on a
local or a remote Ray (issue "Every NPU, not one")."""
