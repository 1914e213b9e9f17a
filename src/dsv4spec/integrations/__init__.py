"""Adapters that plug dsv4spec's ops into serving engines (SGLang: ``integrations.sglang``)."""
