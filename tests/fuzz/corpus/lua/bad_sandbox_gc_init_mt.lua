-- the initializers' metatable is locked like the tensors'
local mt = getmetatable(zeros())
rawset(mt, "__gc", function() while true do end end) -- ERROR
