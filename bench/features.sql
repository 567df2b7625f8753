-- Benchmark data for `bench/run --features`: the recommended route table for the Anthropic API
-- and two features with bounded limits in every window on the bench plan, so every metered call
-- charges company, user and the four feature counters (company period and day, user period and
-- day) in its admission. Limits are far above what a run reaches.
INSERT INTO features (id, name, sort_order) VALUES ('analysis', 'Analysis', 1), ('chat', 'Chat', 2);
INSERT INTO plan_features (plan_id, feature_id, daily_limit, period_limit, user_daily_limit, user_period_limit)
VALUES ('bench', 'analysis', 1000000000000, 1000000000000, 1000000000000, 1000000000000),
       ('bench', 'chat', 1000000000000, 1000000000000, 1000000000000, 1000000000000);
INSERT INTO routes (id, method, path, units, items_field, feature, feature_header) VALUES
    ('models', 'GET', '/v1/models*', 0, NULL, NULL, false),
    ('count-tokens', 'POST', '/v1/messages/count_tokens', 0, NULL, NULL, false),
    ('batches', 'POST', '/v1/messages/batches', 1, 'requests', 'analysis', false),
    ('messages', 'POST', '/v1/messages', 1, NULL, 'analysis', true);
ANALYZE;
