-- REDLOCK ACQUIRE (round 1, on one master): take the lease if it is free
-- and read the node's fence counter, floored by the node's clock.
-- KEYS[1] lease, KEYS[2] fence hash, KEYS[3] this owner's released marker
-- ARGV[1] owner (random, 32 hex), ARGV[2] lease ms, ARGV[3] fence ttl ms
-- Returns:
--   {1, counter}  this owner holds the lease here (now, or by an earlier
--                 try whose reply was lost); counter: decimal string
--   {0, pttl, holder}  another owner (holder) holds it for pttl ms
--   {-1, 0}       this owner's attempt already failed and released the
--                 key here (KEYS[3] exists): a late request changes nothing
-- The counter is max(stored, the server's TIME in µs), and is stored, so a
-- node that restarted empty (or whose counter expired) never reports less
-- than its clock. Values stay below 2^53 (Lua numbers are exact there)
-- until the year 2255.
if redis.call('EXISTS', KEYS[3]) == 1 then
  return {-1, 0}
end
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then
  return {0, redis.call('PTTL', KEYS[1]), cur}
end
local t = redis.call('TIME')
local now = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
local n = redis.call('HGET', KEYS[2], 'n')
if not n or tonumber(n) < tonumber(now) then
  n = now
  redis.call('HSET', KEYS[2], 'n', n)
end
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return {1, n}
