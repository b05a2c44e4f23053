-- TAGADD: record in a tag's index that the key whose hash tag is ARGV[2]
-- is about to hold a value carrying the tag, unless the tag was purged
-- after the rebuild of that value began (see tags.go for the proof).
-- KEYS[1] the tag's index: a sorted set of key hash tags, each scored by
-- the expiry of the key's value (this server's clock, ms) plus a grace;
-- KEYS[2] the generation of the tag's last purge
-- ARGV[1] the purge generation read before the rebuild's load began, '?'
-- when the rebuild did not read it (then any purge the tag remembers
-- refuses), '' for Cache.Set (no check), ARGV[2] member, ARGV[3] the
-- value's hard ttl ms, ARGV[4] grace ms, ARGV[5] the most members the
-- index may hold
-- Returns 1 when recorded, 0 when the tag was purged since ARGV[1] (the
-- value must not be stored), 2 when the index is full.
-- Only the trim of dead members comes before a check that can refuse;
-- an error reply leaves the index as it was.
local ttl, grace, most = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if not ttl or ttl < 1 or not grace or grace < 0 or not most or most < 1 then
  return redis.error_reply('ERR herd tagadd: invalid arguments')
end
local it = redis.call('TYPE', KEYS[1]).ok
if it ~= 'zset' and it ~= 'none' then
  -- Not dropped: a purge could then miss the keys it held.
  return redis.error_reply('ERR herd tagadd: the tag index is not a sorted set')
end
if ARGV[1] ~= '' then
  -- A foreign type at KEYS[2] makes GET fail: refused as an error.
  local p = redis.call('GET', KEYS[2])
  if p and (ARGV[1] == '?' or not (tonumber(p) and tonumber(p) <= tonumber(ARGV[1]))) then
    return 0
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%d', now))
local score = now + ttl + grace
local old = redis.call('ZSCORE', KEYS[1], ARGV[2])
if not old then
  if redis.call('ZCARD', KEYS[1]) >= most then
    return 2
  end
  redis.call('ZADD', KEYS[1], string.format('%d', score), ARGV[2])
elseif tonumber(old) < score then
  -- A score never goes down: it covers every value recorded under it.
  redis.call('ZADD', KEYS[1], string.format('%d', score), ARGV[2])
end
-- The index expires with its longest-lived member.
local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], top[2])
return 1
