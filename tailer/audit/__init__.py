"""Auditing a table: who changed what, when and how much; alert rules, webhooks, audit logs and the HTML report."""
