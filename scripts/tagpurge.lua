-- TAGPURGE: one page of a tag purge. Raise the tag's purge generation to
-- ARGV[1] first, so that from now on no rebuild that began before the
-- purge records the tag (TAGADD refuses it), then return one page of the
-- index's live members: every key recorded before, for the purge to
-- invalidate. The index itself is left as it is (a retried purge finds
-- the same keys); members leave it when their values expire.
--
-- Pages go in score order, not by ZSCAN: a ZSCAN cursor only means
-- something to the server that gave it, and the next page may go to
-- another one (a failover, a restart, a slot moved to another master).
-- The cursor is the score the last page ended at; a page holds every
-- member of its last score, so none is left between two pages. A score
-- only goes up (tagadd.lua), so a member present from the first page to
-- the last is in one of them.
-- KEYS[1] the tag's index, KEYS[2] the generation of its last purge
-- ARGV[1] generation, ARGV[2] its ttl ms, ARGV[3] cursor ('0' to start),
-- ARGV[4] page size
-- Returns {next cursor ('0' when done), member, member, ...}.
local g, keep, count = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4])
local from = tonumber(ARGV[3])
if not g or not keep or keep < 1 or not count or count < 1 or not from then
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
-- Live members only (score >= now); after the first page, those above
-- the cursor.
local lo = string.format('%d', now)
if ARGV[3] ~= '0' and from >= now then
  lo = '(' .. ARGV[3]
end
local r = redis.call('ZRANGEBYSCORE', KEYS[1], lo, '+inf', 'WITHSCORES', 'LIMIT', 0, count)
local out = {'0'}
if #r < 2 * count then
  for i = 1, #r, 2 do
    out[#out + 1] = r[i]
  end
  return out
end
local hi = r[#r]
for i = 1, #r, 2 do
  if r[i + 1] ~= hi then
    out[#out + 1] = r[i]
  end
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], hi, hi)) do
  out[#out + 1] = m
end
out[1] = hi
return out
