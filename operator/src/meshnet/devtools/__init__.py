"""Developer tools: the helm/kubectl installer and the emulated cluster used by the
operator's tests and benchmark (they need the dev extras: kmock)."""
