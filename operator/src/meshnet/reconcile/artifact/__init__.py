"""Planning for ModelArtifacts: `plan_artifact(observed, config, now)` and its parts."""
