"""Platform adapters: each knows its platform and nothing about models."""
