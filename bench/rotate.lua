-- wrk script: one request per user in turn, users u0 .. u(N-1), so that the
-- load spreads over N subjects like bench/loadgen's {user} placeholder.
--   wrk ... -s rotate.lua URL -- METHOD USERS BODY [HEADER ...]
-- BODY and each "Name: value" HEADER may hold {user}; BODY "-" sends none.
local reqs = {}
local n, i = 0, 0

function init(args)
  local method, users, body = args[1] or "GET", tonumber(args[2] or "1"), args[3] or "-"
  local path = wrk.path
  for u = 0, users - 1 do
    local user = "u" .. u
    local headers = {}
    for k = 4, #args do
      local name, value = args[k]:match("^([^:]+):%s*(.*)$")
      if name then headers[name] = value:gsub("{user}", user) end
    end
    local b = nil
    if body ~= "-" then
      b = body:gsub("{user}", user)
      headers["Content-Type"] = "application/json"
    end
    reqs[u + 1] = wrk.format(method, (path:gsub("{user}", user)), headers, b)
  end
  n = users
  -- Threads start at different users.
  i = math.random(0, n - 1)
end

function request()
  i = i % n + 1
  return reqs[i]
end
