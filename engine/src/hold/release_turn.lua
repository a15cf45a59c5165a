-- Deletes the key only while its value names the turn `ARGV[1]` (`{turn_id}:`): how a
-- survivor frees the agent of a turn whose replica died, without knowing its token.
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
