"""Stubs generated from proto/corral/v1/corral.proto (not checked in; see ``corral_client._generate``)."""
