// space-gateway
#pragma once
