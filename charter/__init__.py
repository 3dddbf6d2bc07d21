"""Charter: the control plane for AI-agent fan-out."""
