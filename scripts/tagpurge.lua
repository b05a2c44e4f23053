-- TAGPURGE: one page of a tag purge. Raise the tag's purge generation to
-- ARGV[1] first, so that from now on no rebuild that began before the
-- purge records the tag (TAGADD refuses it), then return one ZSCAN page
-- of the index's live members: every key recorded before, for the purge
-- to invalidate. The index itself is left as it is (a retried purge
-- finds the same keys); members leave it when their values expire.
-- KEYS[1] the tag's index, KEYS[2] the generation of its last purge
-- ARGV[1] generation, ARGV[2] its ttl ms, ARGV[3] ZSCAN cursor,
-- ARGV[4] ZSCAN count
-- Returns {next cursor, member, member, ...}.
local g, keep = tonumber(ARGV[1]), tonumber(ARGV[2])
if not g or not keep or keep < 1 then
  return redis.error_reply('ERR herd tagpurge: invalid arguments')
end
local it = redis.call('TYPE', KEYS[1]).ok
if it ~= 'zset' and it ~= 'none' then
  return redis.error_reply('ERR herd tagpurge: the tag index is not a sorted set')
end
-- A foreign value at KEYS[2] is replaced: a higher generation only
-- refuses more rebuilds.
local pt = redis.call('TYPE', KEYS[2]).ok
if pt ~= 'string' and pt ~= 'none' then
  redis.call('DEL', KEYS[2])
end
local p = tonumber(redis.call('GET', KEYS[2])) or 0
local left = redis.call('PTTL', KEYS[2])
redis.call('SET', KEYS[2], string.format('%d', math.max(p, g)), 'PX', string.format('%d', math.max(left, keep)))
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local r = redis.call('ZSCAN', KEYS[1], ARGV[3], 'COUNT', ARGV[4])
local out = {r[1]}
local kv = r[2]
for i = 1, #kv, 2 do
  if tonumber(kv[i + 1]) >= now then
    out[#out + 1] = kv[i]
  end
end
return out
