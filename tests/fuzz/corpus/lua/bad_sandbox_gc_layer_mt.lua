-- an nn layer's metatable is locked: no __gc to hand on through setmetatable
local fc = nn.Linear("fc", 4, 4)
local mt = getmetatable(fc)
mt.__gc = function() while true do end end -- ERROR
setmetatable({}, mt)
