-- TAGBUMP: raise the purge generation of the Cache's prefix and return
-- it (a decimal string). It is max(G + 1, the server's clock in µs), as
-- fences are (acquire.lua): it never goes backwards when the key is lost
-- (a restart, a failover to a replica that missed it). A foreign value
-- is replaced.
-- KEYS[1] the generation
local ty = redis.call('TYPE', KEYS[1]).ok
if ty ~= 'string' and ty ~= 'none' then
  redis.call('DEL', KEYS[1])
end
local t = redis.call('TIME')
local g = math.max((tonumber(redis.call('GET', KEYS[1])) or 0) + 1, t[1] * 1000000 + t[2])
local s = string.format('%d', g)
redis.call('SET', KEYS[1], s)
return s
