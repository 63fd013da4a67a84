-- KEYS: the scopes' sorted sets ; ARGV: tokens -> 1
for _, key in ipairs(KEYS) do redis.call('ZREM', key, unpack(ARGV)) end
return 1
