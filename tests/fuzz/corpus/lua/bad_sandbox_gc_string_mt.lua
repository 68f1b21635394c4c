-- the strings' metatable (which nn.lua's code shares) is locked
local mt = getmetatable("")
mt.__index = function() while true do end end -- ERROR
