"""dse: design-space exploration of LLM-serving deployments on top of simcore."""
